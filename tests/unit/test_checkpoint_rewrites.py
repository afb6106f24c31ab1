"""A checkpoint of a step that already has one, and one a person removed while the trainer ran.

The final checkpoint after an accepted config change rewrites the resumed step; a request for a
step already checkpointed marks it requested. Neither may lose the step: a write that fails (a full
disk, the loss log's sync refused) leaves the old checkpoint as it was, and a checkpoint pruned by
hand is reported gone so the trainer writes it again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.checkpoint import catalog
from andrea.daemon.checkpoint.manager import CheckpointManager, read_manifest, verify_checkpoint
from andrea.daemon.config import CheckpointConfig
from andrea.daemon.rundir import layout as rundir
from tests.support.hostile import snapshot, write_checkpoint


@pytest.fixture
def manager(tmp_path: Path):
    write_checkpoint(tmp_path, 10)
    mgr = CheckpointManager(tmp_path, CheckpointConfig(every=0, keep_latest=100))
    yield mgr
    mgr.close()


def refuse() -> None:
    raise OSError(28, "No space left on device")


def files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file()}


@pytest.mark.parametrize("other_bytes", [False, True], ids=["same-bytes", "other-bytes"])
def test_a_failed_rewrite_of_the_step_keeps_its_checkpoint(
    manager: CheckpointManager, tmp_path: Path, other_bytes: bool
) -> None:
    before = files(tmp_path)
    snap = snapshot(10)
    if other_bytes:
        snap.payload[-4:] = 1
    # The loss log's sync runs once the payload is durable and before the commit; the trainer's
    # own failure at that point is the one a full disk gives most often.
    with pytest.raises(OSError, match="No space"):
        manager.save(snap, "end", before_commit=refuse)
    assert files(tmp_path) == before  # not a byte changed, no temporary left
    manifest, _ = verify_checkpoint(tmp_path, 10)
    assert manifest.trigger == "cadence"


@pytest.mark.parametrize("other_bytes", [False, True], ids=["same-bytes", "other-bytes"])
def test_a_rewrite_of_the_step_commits_the_new_checkpoint(
    manager: CheckpointManager, tmp_path: Path, other_bytes: bool
) -> None:
    snap = snapshot(10)
    if other_bytes:
        snap.payload[-4:] = 1
    manager.save(snap, "end")
    manifest, payload = verify_checkpoint(tmp_path, 10)
    assert manifest.trigger == "end"
    assert (payload.v[-1].tobytes() == np.uint8([1, 1, 1, 1]).tobytes()) is other_bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000010.bin", "step_000010.json"]


def test_a_checkpoint_pruned_by_hand_is_not_marked_but_reported_gone(
    manager: CheckpointManager, tmp_path: Path
) -> None:
    assert manager.holds(10)
    entries = catalog.inventory(tmp_path)
    catalog.prune(tmp_path, catalog.plan_prune(entries, 0, {10}, newest=True))
    assert not manager.holds(10)
    assert manager.mark_requested(10, "control") is False
    assert not (tmp_path / rundir.manifest_name(10)).exists()  # nothing half-made


def test_a_checkpoint_whose_payload_was_cut_is_not_marked(
    manager: CheckpointManager, tmp_path: Path
) -> None:
    (tmp_path / rundir.bin_name(10)).write_bytes(b"")
    assert manager.mark_requested(10, "sigusr1") is False
    assert read_manifest(tmp_path, 10).trigger == "cadence"


def test_marking_an_intact_checkpoint_keeps_it_valid(
    manager: CheckpointManager, tmp_path: Path
) -> None:
    assert manager.mark_requested(10, "sigusr1") is True
    manifest, _ = verify_checkpoint(tmp_path, 10)
    assert manifest.trigger == "sigusr1"
