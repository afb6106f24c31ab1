"""Re-signed manifest edits (issue 24, item 9): a manifest whose `adam_step`, or a data cursor's
position or epoch, was edited and its `content_sha256` recomputed as documented is intact by its
hash, and was resumed silently. A resume cross-checks what something else fixes — Adam's step
count against the step and the schedule, each cursor against the batch its arm last drew, as the
records hold it — and skips such a checkpoint as damaged, naming the field."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.checkpoint.manager import CheckpointManager, read_manifest
from andrea.daemon.checkpoint.training.crosscheck import CrossCheck
from andrea.daemon.config import CheckpointConfig, build_config
from andrea.daemon.data.arms import Arm, ArmStream
from andrea.daemon.rundir.layout import LOSS_FILE
from andrea.daemon.rundir.losslog import LossLog, read_entries
from andrea.protocol.lossentry import LossEntry
from tests.support.hostile import ARMS, MODEL, snapshot
from tests.support.manifests import edit_manifest, move_cursor

#: The data order's seed: the one the manifests of `hostile.snapshot` record.
SEED = build_config({}, {"preset": "andrea-tiny"}).seed
BATCH = 2


def _streams() -> list[ArmStream]:
    rng = np.random.default_rng(0)
    arms = [Arm(n, ident, rng.integers(0, 255, 401).astype(np.uint16)) for n, ident in ARMS.items()]
    return [ArmStream(a, SEED, MODEL.block_size) for a in arms]


def _train(run_dir: Path, steps: int, accum: int = 2) -> list[ArmStream]:
    """Draw `steps` steps as the trainer does (arm by step, `accum` micro-batches each), log them
    with their batch digests, and checkpoint the last step with the streams' cursors."""
    streams = _streams()
    entries = []
    for step in range(1, steps + 1):
        stream = streams[step % 3 % 2]
        sha = hashlib.sha256()
        for _ in range(accum):
            sha.update(stream.next_batch(BATCH).tobytes())
        tokens = accum * BATCH * MODEL.block_size
        entries.append(
            LossEntry(
                step=step,
                loss=3.0,
                arm=stream.arm.name,
                lr=1e-3,
                tokens=tokens,
                wall_time=time.time(),
                segment=1,
                phase=0,
                batch_sha256=sha.hexdigest(),
            )
        )
    with LossLog.open(run_dir / LOSS_FILE) as log:
        log.append_many(entries)
    snap = snapshot(steps)
    snap.fields["data"] = [s.state_dict() for s in streams]
    mgr = CheckpointManager(run_dir, CheckpointConfig(every=0, keep_latest=100))
    try:
        mgr.save(snap, "cadence")
    finally:
        mgr.close()
    return _streams()


def _problems(run_dir: Path, streams: list[ArmStream], step: int) -> list[str]:
    return CrossCheck(run_dir / LOSS_FILE, streams).problems(read_manifest(run_dir, step))


def test_a_genuine_manifest_passes(tmp_path: Path) -> None:
    streams = _train(tmp_path, 40)  # the smaller arm wraps into its next epochs
    assert _problems(tmp_path, streams, 40) == []


@pytest.mark.parametrize(
    "field,edit",
    [
        ("adam_step", lambda m: m["optimizer"].update(adam_step=m["optimizer"]["adam_step"] + 1)),
        ("scheduler.last_step", lambda m: m["scheduler"].update(last_step=3)),
        ("scheduler.last_lr", lambda m: m["scheduler"].update(last_lr=m["scheduler"]["lr"])),
        ("scheduler.lr", lambda m: m["scheduler"].update(lr=1.0)),
        ("cursor 'docstrings'", lambda m: move_cursor(m, 0, "position")),
        ("cursor 'code'", lambda m: move_cursor(m, 1, "epoch")),
    ],
)
def test_a_re_signed_edit_is_named(tmp_path: Path, field: str, edit) -> None:
    streams = _train(tmp_path, 40)
    edit_manifest(tmp_path, 40, edit)
    read_manifest(tmp_path, 40)  # intact by its content hash: the edit is re-signed
    problems = _problems(tmp_path, streams, 40)
    name = field.split("'")[1] if "'" in field else field
    assert problems and name in problems[0], problems


def test_the_cursor_is_judged_on_its_own_trajectory(tmp_path: Path) -> None:
    streams = _train(tmp_path, 12)
    # A later life re-trained steps 11 and 12 on other batches (after a resume from step 10):
    # those records are not the checkpoint of step 12's.
    later = [
        e.model_copy(update={"segment": 2, "batch_sha256": "0" * 64})
        for e in read_entries(tmp_path / LOSS_FILE)[-2:]
    ]
    with LossLog.open(tmp_path / LOSS_FILE) as log:
        log.append_many(later)
    assert _problems(tmp_path, streams, 12) == []
    # Records without a digest (older runs) leave the cursors unchecked; a log that cannot be
    # read does too (the daemons refuse it themselves).
    (tmp_path / LOSS_FILE).unlink()
    (tmp_path / LOSS_FILE).mkdir()
    edit_manifest(tmp_path, 12, lambda m: move_cursor(m, 0, "position"))
    assert _problems(tmp_path, streams, 12) == []


def test_draws_of_an_earlier_life_are_not_compared(tmp_path: Path) -> None:
    """A restart may change the seed (the data order) or reset a cursor (--allow-config-change)
    before its first step: a cursor is compared only with a draw of the checkpoint's own life."""
    streams = _train(tmp_path, 12)

    def restarted_with_another_seed(m: dict) -> None:
        m["progress"]["segment"] = 2
        m["config"]["seed"] += 1

    edit_manifest(tmp_path, 12, restarted_with_another_seed)
    assert _problems(tmp_path, streams, 12) == []


def test_pending_records_count_as_recorded(tmp_path: Path) -> None:
    streams = _train(tmp_path, 12)
    entries = read_entries(tmp_path / LOSS_FILE)
    (tmp_path / LOSS_FILE).write_text("[\n]\n")
    pending = [e.model_dump(mode="json") for e in entries]
    edit_manifest(tmp_path, 12, lambda m: m.update(pending_losses=pending))
    assert _problems(tmp_path, streams, 12) == []
    edit_manifest(tmp_path, 12, lambda m: move_cursor(m, 1, "position"))
    assert "cursor" in " ".join(_problems(tmp_path, streams, 12))


# ---- with the real trainer ---------------------------------------------------------------------


def _started_from(adam_steps: int, optimizer: bool):
    """An edit that makes the manifest's run one started with --init-from (a source whose Adam had
    taken `adam_steps` steps), carrying Adam's state along when `optimizer`."""

    def edit(m: dict) -> None:
        m["lineage"] = {
            "world_sizes": [{"from_step": 0, "world_size": 1}],
            "init_from": {
                "path": "/runs/source/step_000300.bin",
                "step": 300,
                "bin_sha256": "ab" * 32,
                "manifest_sha256": "cd" * 32,
                "preset": "andrea-tiny",
                "config_hash": "ef" * 32,
                "optimizer": optimizer,
            },
        }
        m["source_manifest"] = {"optimizer": {"adam_step": adam_steps}}
        if optimizer:
            m["optimizer"]["adam_step"] += adam_steps

    return edit


@pytest.mark.parametrize("optimizer", [True, False])
def test_a_run_started_from_another_counts_adam_steps_from_its_source(
    tmp_path: Path, optimizer: bool
) -> None:
    """--init-from-optimizer carries the source's Adam step count on: a genuine manifest of such a
    run passes, and an edit of its count is still named."""
    streams = _train(tmp_path, 40)
    edit_manifest(tmp_path, 40, _started_from(300, optimizer))
    assert _problems(tmp_path, streams, 40) == []
    edit_manifest(
        tmp_path, 40, lambda m: m["optimizer"].update(adam_step=m["optimizer"]["adam_step"] + 1)
    )
    expected = "is not 340: step 40 after the 300" if optimizer else "is not step 40"
    problems = _problems(tmp_path, streams, 40)
    assert problems and expected in problems[0], problems
