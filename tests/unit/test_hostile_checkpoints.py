"""Checkpoint files a person or a program damaged on purpose (issue 12, items 4-8): each is skipped
with its reason before anything is allocated, and the previous checkpoint is resumed; a run whose
manifests are all gone is refused, never silently restarted."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from andrea.daemon.checkpoint.manager import CheckpointManager, ResumeRefused
from andrea.daemon.config import CheckpointConfig
from andrea.daemon.rundir import layout as rundir
from tests.support.hostile import expectation, resign, write_checkpoint, write_checkpoint_with


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    for step in (10, 20):
        write_checkpoint(tmp_path, step)
    return tmp_path


def _load(run_dir: Path, **kw):
    mgr = CheckpointManager(run_dir, CheckpointConfig(every=0))
    try:
        return mgr.load(expectation(**kw))
    finally:
        mgr.close()


def _edit(run_dir: Path, step: int, change: Callable[[dict], None], sign: bool = True) -> None:
    path = run_dir / rundir.manifest_name(step)
    man = json.loads(path.read_text())
    change(man)
    path.write_text(json.dumps(resign(man) if sign else man, indent=1))


def _skips_newest(run_dir: Path, reason: str) -> None:
    loaded = _load(run_dir)
    assert loaded is not None and loaded.manifest.step == 10
    assert len(loaded.skipped) == 1 and "step_000020.json" in loaded.skipped[0]
    assert reason in loaded.skipped[0], loaded.skipped


def test_valid_checkpoints_load(run_dir: Path) -> None:
    loaded = _load(run_dir)
    assert loaded is not None and loaded.manifest.step == 20 and loaded.skipped == []


@pytest.mark.parametrize(
    "path",
    [
        ("optimizer", "adam_step"),
        ("data", 0, "position"),
        ("progress", "tokens_seen"),
        ("scheduler", "last_step"),
    ],
)
def test_any_valid_json_edit_is_detected(run_dir: Path, path: tuple) -> None:
    def bump(man: dict) -> None:
        node = man
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] += 1

    _edit(run_dir, 20, bump, sign=False)
    _skips_newest(run_dir, "does not match the content")


def test_one_base64_character_of_an_rng_state(run_dir: Path) -> None:
    def flip(man: dict) -> None:
        s = man["rng"]["torch_cpu"]
        man["rng"]["torch_cpu"] = s[:100] + ("A" if s[100] != "A" else "B") + s[101:]

    _edit(run_dir, 20, flip, sign=False)
    _skips_newest(run_dir, "does not match the content")


@pytest.mark.parametrize(
    "name,change,reason",
    [
        (
            "numpy-key-2^40",
            lambda m: m["rng"]["numpy_global"]["state"]["key"].__setitem__(0, 2**40),
            "key has a word outside",
        ),
        (
            "numpy-pos-huge",
            lambda m: m["rng"]["numpy_global"]["state"].__setitem__("pos", 10**12),
            "pos 1000000000000 is outside",
        ),
        (
            "python-negative-word",
            lambda m: m["rng"]["python"][1].__setitem__(5, -1),
            "Python random state has a word outside",
        ),
        ("python-version-99", lambda m: m["rng"]["python"].__setitem__(0, 99), "version 99"),
        (
            "cursor-past-arm",
            lambda m: m["data"][1].__setitem__("position", 50),
            "cursor position 50 is outside its 50 chunks",
        ),
        (
            "bin-file-outside",
            lambda m: m.__setitem__("bin_file", "../other/step_000020.bin"),
            "is not 'step_000020.bin'",
        ),
        (
            "n-params-3e9",
            lambda m: m.update(n_params=3_000_000_000, bin_size=8 + 12 * 3_000_000_000),
            "n_params",
        ),
    ],
)
def test_resume_values_are_validated_before_trusting(
    run_dir: Path, name: str, change: Callable[[dict], None], reason: str
) -> None:
    # Re-signed, so the content hash holds: the value checks behind it must catch each of these.
    _edit(run_dir, 20, change)
    _skips_newest(run_dir, reason)


def test_huge_sparse_manifest_is_not_read(run_dir: Path) -> None:
    with open(run_dir / rundir.manifest_name(20), "r+b") as f:
        f.truncate(64 << 30)  # 64 GiB, sparse: allocating it would fail every restart
    _skips_newest(run_dir, "more than the 16,777,216 its format allows")


def test_manifest_symlink_to_dev_zero(run_dir: Path) -> None:
    path = run_dir / rundir.manifest_name(20)
    path.unlink()
    os.symlink("/dev/zero", path)
    _skips_newest(run_dir, "not a regular file (a symbolic link")


def test_payload_that_is_a_directory(run_dir: Path) -> None:
    path = run_dir / rundir.bin_name(20)
    path.unlink()
    path.mkdir()
    _skips_newest(run_dir, "not a regular file (a directory)")


def test_every_manifest_deleted_is_refused(run_dir: Path) -> None:
    for step in (10, 20):
        (run_dir / rundir.manifest_name(step)).unlink()
    with pytest.raises(ResumeRefused, match=r"step_000010.bin, step_000020.bin\) but no manifest"):
        _load(run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["step_000010.bin", "step_000020.bin"]


def test_one_orphan_is_an_interrupted_first_write(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10)
    (tmp_path / rundir.manifest_name(10)).unlink()
    assert _load(tmp_path) is None


def _as_format_1(man: dict) -> None:
    man.pop("content_sha256")
    man["format_version"] = 1


def test_format_1_manifest_still_loads(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, 10)
    _edit(tmp_path, 10, _as_format_1, sign=False)
    loaded = _load(tmp_path)
    assert loaded is not None and loaded.manifest.step == 10
    assert loaded.manifest.format_version == 1


def test_stripped_hash_after_a_format_2_checkpoint(run_dir: Path) -> None:
    _edit(run_dir, 20, _as_format_1, sign=False)
    _skips_newest(run_dir, "its content hash was removed")


def test_format_2_without_hash(run_dir: Path) -> None:
    _edit(run_dir, 20, lambda m: m.pop("content_sha256"), sign=False)
    _skips_newest(run_dir, "no content_sha256")


def test_mark_requested_keeps_the_manifest_valid(run_dir: Path) -> None:
    mgr = CheckpointManager(run_dir, CheckpointConfig(every=0))
    try:
        mgr.mark_requested(20, "control")
        loaded = mgr.load(expectation())
    finally:
        mgr.close()
    assert (
        loaded is not None and loaded.manifest.step == 20 and loaded.manifest.trigger == "control"
    )


def test_audit_checkpoints_are_bounded(tmp_path: Path) -> None:
    # 200 SIGUSR1s once left 182 audit checkpoints that were never deleted.
    for step in range(1, 8):
        write_checkpoint(tmp_path, step, trigger="sigusr1")
    mgr = CheckpointManager(tmp_path, CheckpointConfig(every=0, max_requested=3))
    try:
        mgr.load(expectation())
        write_checkpoint_with(mgr, 8)
    finally:
        mgr.close()
    assert sorted(p.name for p in tmp_path.glob("step_*.json")) == [
        rundir.manifest_name(s) for s in (6, 7, 8)
    ]


def test_invalid_message_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from andrea.daemon.runtime.logthrottle import ThrottledWarning

    w = ThrottledWarning(logging.getLogger("flood"), burst=5, period=3600)
    for i in range(5018):
        w.warning("rejected an invalid message %d", i)
    assert len(caplog.records) == 5
    w._window_start -= 3600  # the next window
    w.warning("rejected an invalid message %d", -1)
    assert caplog.records[-1].getMessage().endswith("(5013 similar warnings suppressed)")
