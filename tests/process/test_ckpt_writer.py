"""The fast checkpoint path and the background writer: hashing fused with the write, ordering, at
most one write in flight, no torn files, SIGTERM/SIGKILL during an in-flight write, bit-exact resume.

Process tests use real trainer processes and real signals. To land a signal inside a write every
time (a tiny-preset write takes a few milliseconds), they set ANDREA_CKPT_TEST_WRITE_DELAY: the
writer pauses that long after the payload's bytes are written and before its fsync and rename —
the window in which a crash or a stop is most dangerous.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from andrea.daemon.checkpoint.manager import CheckpointManager, Snapshot
from andrea.daemon.checkpoint.writer import (
    StagingBuffer,
)
from andrea.daemon.config import CheckpointConfig
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 20
EVERY = 2
CADENCE_POINTS = list(range(EVERY, STEPS + 1, EVERY))
CADENCE_TOML = f'preset = "andrea-tiny"\n[checkpoint]\nevery = {EVERY}\nkeep_latest = 100\n'
DELAY = {"ANDREA_CKPT_TEST_WRITE_DELAY": "1.0"}


# ---- the I/O engine -------------------------------------------------------------------------------


# ---- the background writer ------------------------------------------------------------------------


def _snapshot(step: int, staging: StagingBuffer, fields: dict) -> Snapshot:
    n = staging.n_params
    g = torch.Generator().manual_seed(step)
    w, m, v = (torch.randn(n, generator=g) for _ in range(3))
    payload = staging.fill(step, [w], [m], [v])
    return Snapshot(step=step, fields=fields, payload=payload, ready=staging.ready)


@pytest.fixture(scope="module")
def manifest_fields(reference: Path) -> dict:
    """Every manifest field a real trainer writes, taken from a real checkpoint (layout replaced)."""
    man = json.loads((reference / rundir.manifest_name(STEPS)).read_text())
    for k in (
        "format_version",
        "step",
        "n_params",
        "bin_file",
        "bin_size",
        "bin_sha256",
        "trigger",
        "created_utc",
        "content_sha256",
    ):
        man.pop(k)
    man["layout"] = [{"name": "flat", "shape": [1000], "offset": 0}]
    return man


def test_async_saves_commit_in_order_and_verify(tmp_path: Path, manifest_fields: dict) -> None:
    mgr = CheckpointManager(tmp_path, CheckpointConfig(keep_latest=3))
    staging = StagingBuffer(1000)
    done: list[int] = []
    synced: list[int] = []

    for step in range(1, 6):
        fields = {**manifest_fields, "progress": {**manifest_fields["progress"], "step": step}}
        snap = _snapshot(step, staging, fields)
        expected = snap.payload.tobytes()

        def on_done(man, err, seconds, step=step, expected=expected) -> None:
            assert err is None, err
            done.append(man.step)
            assert (tmp_path / rundir.bin_name(step)).read_bytes() == expected

        mgr.save_async(
            snap, "cadence", on_done=on_done, before_commit=lambda step=step: synced.append(step)
        )
        # The next snapshot may only be staged once this write no longer reads the buffer.
        mgr.wait()
        assert mgr.in_flight() is None
    mgr.close()
    assert done == synced == [1, 2, 3, 4, 5]
    assert sorted(mgr.candidates()) == [3, 4, 5]  # retention: the newest 3
    for s in (3, 4, 5):
        manifest, payload = mgr.verify(s)
        assert manifest.trigger == "cadence" and payload.step == s
    assert not list(tmp_path.glob("*.tmp"))


def test_failed_async_save_is_reported_and_keeps_previous(
    tmp_path: Path, manifest_fields: dict
) -> None:
    mgr = CheckpointManager(tmp_path, CheckpointConfig(keep_latest=2))
    staging = StagingBuffer(1000)
    results: list = []
    mgr.save_async(
        _snapshot(1, staging, manifest_fields),
        "cadence",
        on_done=lambda m, e, s: results.append((m, e)),
    )
    mgr.wait()

    def disk_full() -> None:
        raise OSError(28, "No space left on device")

    mgr.save_async(
        _snapshot(2, staging, manifest_fields),
        "cadence",
        on_done=lambda m, e, s: results.append((m, e)),
        before_commit=disk_full,
    )
    mgr.wait()  # an OSError is the callback's to report, not re-raised
    mgr.close()
    assert results[0][0].step == 1 and results[0][1] is None
    assert results[1][0] is None and isinstance(results[1][1], OSError)
    assert mgr.candidates() == [1]  # step 2 never committed: no manifest
    mgr.verify(1)


# ---- real trainer processes, real signals -------------------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The never-stopped run, its writes instant: a checkpoint every EVERY steps, all kept (the
    cadence test's baseline; the cadence does not change what is trained)."""
    run_dir = tmp_path_factory.mktemp("reference")
    (run_dir / "run.toml").write_text(CADENCE_TOML)
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS))
    assert res.returncode == 0, res.stderr
    assert _intact(run_dir) == CADENCE_POINTS, res.stderr
    return run_dir


def _losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in json.loads((run_dir / ".loss.json").read_text())}


def _intact(run_dir: Path) -> list[int]:
    mgr = CheckpointManager.__new__(CheckpointManager)  # discovery and verification only
    mgr.run_dir = run_dir
    steps = mgr.candidates()
    for s in steps:
        mgr.verify(s)  # raises if torn
    return sorted(steps)


def test_sigterm_during_background_write_waits_then_writes_final(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    t = Daemon(
        trainer_cmd(
            tmp_path,
            cache_dir,
            "--max-steps",
            "1000",
            "--checkpoint-every",
            "5",
            "--log-level",
            "DEBUG",
        ),
        env=DELAY,
    )
    t.wait_for(r"checkpoint of step 5 handed over")
    t.wait_for(r"step 6/")  # training went on; the write of step 5 (1 s) is still in flight
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    log = t.log
    assert "waiting for the checkpoint of step 5 being written" in log, log
    final = int(re.search(r"checkpoint step_(\d+)\.bin written \(sigterm", log).group(1))
    # The in-flight write finished (committed) before the final one started, which is synchronous.
    assert log.index("step_000005.bin written (cadence") < log.index(
        f"step_{final:06d}.bin written (sigterm"
    )
    assert 5 < final < 10
    assert _intact(tmp_path) == [5, final]
    assert not list(tmp_path.glob("*.tmp"))
    # Resuming from the SIGTERM checkpoint reproduces the never-stopped run bit for bit.
    res = run_trainer(tmp_path, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "5")
    assert res.returncode == 0 and f"resumed from step_{final:06d}.bin" in res.stderr, res.stderr
    assert _losses(tmp_path) == _losses(reference)
    assert (tmp_path / rundir.bin_name(STEPS)).read_bytes() == (
        reference / rundir.bin_name(STEPS)
    ).read_bytes()


def test_sigkill_during_background_write_leaves_no_torn_checkpoint(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    t = Daemon(
        trainer_cmd(
            tmp_path,
            cache_dir,
            "--max-steps",
            "1000",
            "--checkpoint-every",
            "5",
            "--log-level",
            "DEBUG",
        ),
        env=DELAY,
    )
    t.wait_for(r"checkpoint step_000005.bin written \(cadence")
    t.wait_for(r"checkpoint of step 10 handed over")
    time.sleep(
        0.3
    )  # inside the write of step 10: its payload is written, not yet synced or renamed
    t.signal(signal.SIGKILL)
    t.wait()
    assert list(tmp_path.glob("step_000010.bin.*.tmp")), (
        "the kill should have landed inside the write"
    )
    assert _intact(tmp_path) == [5]  # step 10 does not exist: no manifest, no half-valid file
    res = run_trainer(tmp_path, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "5")
    assert res.returncode == 0, res.stderr
    assert (
        "removing step_000010.bin" in res.stderr and "resumed from step_000005.bin" in res.stderr
    ), res.stderr
    assert _losses(tmp_path) == _losses(reference)
    assert (tmp_path / rundir.bin_name(STEPS)).read_bytes() == (
        reference / rundir.bin_name(STEPS)
    ).read_bytes()


def test_cadence_points_during_a_write_wait_and_are_never_skipped(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    """Writes slower than the cadence: every cadence checkpoint is still written, in step order."""
    (tmp_path / "run.toml").write_text(CADENCE_TOML)
    env = {**os.environ, "ANDREA_CKPT_TEST_WRITE_DELAY": "0.3"}
    res = forkserver.run(
        trainer_cmd(tmp_path, cache_dir, "--max-steps", str(STEPS)),
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    written = [
        int(s)
        for s in re.findall(r"checkpoint step_(\d+)\.bin written \((?:cadence|end)", res.stderr)
    ]
    assert written == CADENCE_POINTS, res.stderr
    assert _intact(tmp_path) == CADENCE_POINTS
    # Same bytes as with instant writes (the reference): the snapshot is of its own step.
    for s in CADENCE_POINTS:
        assert (tmp_path / rundir.bin_name(s)).read_bytes() == (
            reference / rundir.bin_name(s)
        ).read_bytes()
    assert _losses(tmp_path) == _losses(reference)
