"""Hostile inputs that need real processes (issue 12): a dying proxy under --with-proxy, a hangup,
a full disk. Each ends with the documented exit code and a clear line, loses nothing durable, and
recovers by a plain restart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from andrea.daemon.checkpoint.manager import verify_checkpoint
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, andreactl, run_trainer, trainer_cmd


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def test_proxy_exit_a_restart_cannot_cure_stops_the_trainer(
    tmp_path: Path, cache_dir: Path
) -> None:
    # Valid as a file (andrea-trainer --with-proxy refuses an invalid one before it starts
    # anything), but infeasible for the run's arms: the proxy exits 2 when it builds its bandit.
    (tmp_path / rundir.POLICY_FILE).write_text(
        "[arms.code]\ncap = 0.0\n[arms.comments]\ncap = 0.0\n[arms.docstrings]\ncap = 0.5\n"
    )
    res = run_trainer(tmp_path, cache_dir, "--with-proxy", "--max-steps", "50")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "andrea-proxy exited with code 2 (CONFIG_ERROR): a restart cannot cure" in res.stderr
    assert "Traceback" not in res.stderr


def test_crashed_proxy_is_restarted(tmp_path: Path, cache_dir: Path) -> None:
    t = Daemon(trainer_cmd(tmp_path, cache_dir, "--with-proxy", "--max-steps", "40"))
    t.wait_for(r"step 5/")
    (proxy,) = _children(t.proc.pid)
    os.kill(proxy, signal.SIGALRM)  # ignored: its default action killed it (exit 142)
    t.wait_for(r"SIGALRM received and ignored")
    os.kill(proxy, signal.SIGKILL)
    t.wait_for(r"andrea-proxy exited with signal SIGKILL; restarting it")
    assert t.wait() == ExitCode.OK, t.log
    steps = sorted({e.step for e in read_entries(tmp_path / rundir.LOSS_FILE)})
    assert steps == list(range(1, 41))


def test_sighup_checkpoints_and_exits(tmp_path: Path, cache_dir: Path) -> None:
    t = Daemon(trainer_cmd(tmp_path, cache_dir, "--max-steps", "100000", "--checkpoint-every", "0"))
    t.wait_for(r"step 4/")
    t.signal(signal.SIGUSR2)  # ignored: its default action would kill without a checkpoint
    t.wait_for(r"SIGUSR2 received and ignored")
    os.kill(t.proc.pid, signal.SIGALRM)  # the same (a stray SIGALRM exited 142, no checkpoint)
    t.wait_for(r"SIGALRM received and ignored")
    # Paused, it is not "stopped", and a fixed mixture has no proxy "not answering".
    t.signal(signal.SIGSTOP)
    try:
        res = andreactl(tmp_path, "status")
    finally:
        t.signal(signal.SIGCONT)
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout.startswith(f"trainer: paused (SIGSTOP, pid {t.proc.pid})"), res.stdout
    assert "stopped" not in res.stdout and "proxy" not in res.stdout, res.stdout
    t.signal(signal.SIGHUP)
    assert t.wait() == ExitCode.OK, t.log
    m = next(iter(tmp_path.glob("step_*.json")))
    assert '"trigger": "sighup"' in m.read_text()


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 6 MiB tmpfs: a real ENOSPC (needs root and mount; skipped where neither is allowed)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\1" * 4096)
        except OSError:
            pass
    return filler


@pytest.mark.parametrize("mode", [[], ["--with-proxy"]], ids=["fixed-mixing", "with-proxy"])
def test_disk_full(small_disk: Path, cache_dir: Path, mode: list[str]) -> None:
    run_dir = small_disk / "run"
    cadence = ["--checkpoint-every", "5"]
    t = Daemon(trainer_cmd(run_dir, cache_dir, *mode, "--max-steps", "100000", *cadence))
    t.wait_for(r"checkpoint step_000005.bin written")
    filler = _fill(small_disk)
    assert t.wait(timeout=180) == ExitCode.CHECKPOINT_FAILED, t.log
    assert "Traceback" not in t.log
    if mode:
        # The proxy's append is the first write after the checkpoint: it stops with 3, which the
        # trainer passes on after its own final checkpoint (which the full disk refuses too).
        assert re.search(r"\[proxy\].*cannot write the run's files .*exit code 3", t.log), t.log
        assert "andrea-proxy exited with code 3 (CHECKPOINT_FAILED): a restart cannot cure" in t.log
    else:
        assert re.search(r"cannot append the loss of step \d+ to .loss.json", t.log), t.log
    # The failed append is undone at once, not left for the next start to repair (issue 24,
    # item 10): the log is whole JSON while the disk is still full, and no line says otherwise.
    entries = json.loads((run_dir / rundir.LOSS_FILE).read_bytes())
    assert entries and "repaired a torn tail" not in t.log, t.log
    # Nothing half-written: no temporary, no payload without a manifest.
    names = {p.name for p in run_dir.iterdir()}
    assert not {n for n in names if n.endswith(".tmp")}
    assert {n[:-4] for n in names if n.endswith(".bin")} == {
        n[:-5] for n in names if n.startswith("step_") and n.endswith(".json")
    }
    # A plain restart once there is space resumes and goes on (the proxy repairs its log's tail);
    # the steps trained again replace the first life's, which logged past its checkpoint.
    filler.unlink()
    last = max(int(n[5:11]) for n in names if n.startswith("step_") and n.endswith(".json"))
    res = run_trainer(run_dir, cache_dir, *mode, "--max-steps", str(last + 3), *cadence)
    assert res.returncode == ExitCode.OK, res.stderr
    assert f"resumed from {rundir.bin_name(last)}" in res.stderr
    curve = canonical_curve(read_entries(run_dir / rundir.LOSS_FILE))
    assert [e.step for e in curve[: last + 3]] == list(range(1, last + 4))
    assert {e.segment for e in curve[last : last + 3]} == {2}


def test_a_rewrite_of_the_resumed_step_on_a_full_disk_keeps_its_checkpoint(
    small_disk: Path, cache_dir: Path
) -> None:
    """An accepted config change rewrites the resumed step's checkpoint at the stop (it must carry
    the new config). On a full disk that write fails with exit 3, and the old checkpoint must still
    be there: it was unlinked first, and the next start began the run again from step 0."""
    run_dir = small_disk / "run"
    res = run_trainer(run_dir, cache_dir, "--max-steps", "6", "--checkpoint-every", "6")
    assert res.returncode == ExitCode.OK, res.stderr
    filler = _fill(small_disk)
    os.truncate(filler, filler.stat().st_size - 64 * 1024)  # room for run.toml, not a payload
    change = ("--seed", "5", "--allow-config-change")
    res = run_trainer(run_dir, cache_dir, "--max-steps", "6", *change)
    assert res.returncode == ExitCode.CHECKPOINT_FAILED, res.stderr
    assert "the newest valid checkpoint is step 6" in res.stderr and "Traceback" not in res.stderr
    manifest, _ = verify_checkpoint(run_dir, 6)
    assert manifest.trigger == "cadence" and manifest.config["seed"] != 5
    assert sorted(p.name for p in run_dir.glob("step_*")) == ["step_000006.bin", "step_000006.json"]
    filler.unlink()
    res = run_trainer(run_dir, cache_dir, "--max-steps", "8", *change)
    assert res.returncode == ExitCode.OK, res.stderr
    assert f"resumed from {rundir.bin_name(6)}" in res.stderr
    curve = canonical_curve(read_entries(run_dir / rundir.LOSS_FILE))
    assert [e.step for e in curve] == list(range(1, 9))


def test_a_full_disk_at_the_start_is_exit_3(small_disk: Path, cache_dir: Path) -> None:
    """docs/operations.md: a full disk is exit 3 wherever it strikes (restarted: freeing space
    cures it), the start included, where it was a configuration error (exit 2, never restarted)."""
    _fill(small_disk)
    res = run_trainer(small_disk / "run", cache_dir, "--max-steps", "3")
    assert res.returncode == ExitCode.CHECKPOINT_FAILED, res.stderr
    assert "No space left on device" in res.stderr and "free space" in res.stderr
    assert "Traceback" not in res.stderr
