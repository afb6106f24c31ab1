"""Bit-exact resume, with real trainer processes and real signals.

The reference is always a run that was never stopped, in a fresh process; the comparison is of
bytes (the final .bin: weights, m, v) and of every step's loss, read back from .loss.json.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 40


def losses(run_dir: Path) -> dict[int, float]:
    """Canonical curve from .loss.json, read with the json module alone (newest entry per step)."""
    entries = json.loads((run_dir / ".loss.json").read_text())
    out: dict[int, float] = {}
    for e in entries:
        out[e["step"]] = e["loss"]
    return out


def entries(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / ".loss.json").read_text())


@pytest.fixture(scope="module")
def continuous(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The never-stopped reference run."""
    run_dir = tmp_path_factory.mktemp("continuous")
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "10")
    assert res.returncode == 0, res.stderr
    return run_dir


def stop_at(run_dir: Path, cache: Path, step: int, sig: signal.Signals, *extra: str) -> Daemon:
    t = Daemon(
        trainer_cmd(run_dir, cache, "--max-steps", str(STEPS), "--checkpoint-every", "10", *extra)
    )
    t.wait_for(rf"step {step}/{STEPS} ")
    t.signal(sig)
    return t


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A run that took a SIGUSR1 audit checkpoint after step 6 and went on, then was stopped by
    SIGTERM after step 13, never resumed: the tests that resume it copy it. Its log is beside it,
    in `trainer.log`."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    t = Daemon(
        trainer_cmd(run_dir, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "10")
    )
    t.wait_for(rf"step 6/{STEPS} ")
    t.signal(signal.SIGUSR1)
    t.wait_for(r"checkpoint step_\d+\.bin written \(sigusr1")
    t.wait_for(rf"step 13/{STEPS} ")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    (run_dir.parent / "trainer.log").write_text(t.log)
    return run_dir


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    """`run_dir` copied, less its control sockets (each copy's daemons make their own)."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".sock", ".socket-dir"))
    return copy


def test_sigterm_then_restart_is_bit_exact(
    tmp_path: Path, cache_dir: Path, continuous: Path, stopped: Path
) -> None:
    run = copy_of(stopped, tmp_path)
    saved = sorted(int(p.stem[5:]) for p in run.glob("step_*.json"))
    last, audit = saved[-1], saved[0]
    assert last not in (10, 20, STEPS), (
        f"stop landed on a cadence point {last}; test needs mid-interval"
    )
    man = json.loads((run / manifest_name(last)).read_text())
    assert man["trigger"] == "sigterm"

    res = run_trainer(run, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "10")
    assert res.returncode == 0, res.stderr
    assert f"resumed from {bin_name(last)}" in res.stderr

    assert losses(run) == losses(continuous)
    assert (run / bin_name(STEPS)).read_bytes() == (continuous / bin_name(STEPS)).read_bytes()
    segs = {e["segment"] for e in entries(run)}
    assert segs == {1, 2}
    # The first life's SIGUSR1 audit point is kept although older than the cadence checkpoints
    # after it (retention keeps the newest 3 of those).
    assert json.loads((run / manifest_name(audit)).read_text())["trigger"] == "sigusr1"
    assert (run / bin_name(audit)).exists() and not (run / bin_name(10)).exists()


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A run stopped by SIGINT after step 4, never resumed (test_failed_final_checkpoint_... copies
    it)."""
    run_dir = tmp_path_factory.mktemp("interrupted") / "run"
    t = stop_at(run_dir, cache_dir, 4, signal.SIGINT)
    assert t.wait() == ExitCode.OK, t.log
    return run_dir


def test_sigint_behaves_like_sigterm(interrupted: Path) -> None:
    (man,) = [json.loads(p.read_text()) for p in interrupted.glob("step_*.json")]
    assert man["trigger"] == "sigint"


def test_sigusr1_checkpoints_and_continues(stopped: Path) -> None:
    """The `stopped` run's SIGUSR1: an audit checkpoint off the cadence, and training went on in
    the same process (test_sigterm_then_restart_is_bit_exact resumes that run and finds it
    bit-exact, and the audit point kept)."""
    log = (stopped.parent / "trainer.log").read_text()
    m = re.search(r"checkpoint (step_(\d+)\.bin) written \(sigusr1", log)
    assert m, log
    man = json.loads((stopped / m.group(1).replace(".bin", ".json")).read_text())
    assert man["trigger"] == "sigusr1" and man["step"] % 10 != 0
    assert log.index(m.group(0)) < log.index(f"step 13/{STEPS} ")


def test_repeated_sigusr1_coalesce_and_sigterm_after_it_writes_once(
    tmp_path: Path, cache_dir: Path
) -> None:
    t = Daemon(trainer_cmd(tmp_path, cache_dir, "--max-steps", "100000", "--checkpoint-every", "0"))
    t.wait_for(r"step 5/")
    for _ in range(3):
        t.signal(signal.SIGUSR1)
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    # Whether the signals landed before or after the step boundary, one checkpoint is written,
    # and it counts as the requested audit point.
    assert t.log.count("checkpoint step_") == 1, t.log
    (man,) = [json.loads(p.read_text()) for p in tmp_path.glob("step_*.json")]
    assert man["trigger"] == "sigusr1"


def test_sigkill_then_restart_is_bit_exact(
    tmp_path: Path, cache_dir: Path, continuous: Path
) -> None:
    t = Daemon(
        trainer_cmd(tmp_path, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "10")
    )
    t.wait_for(rf"step 25/{STEPS} ")
    t.signal(signal.SIGKILL)
    t.wait()
    res = run_trainer(tmp_path, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "10")
    assert res.returncode == 0, res.stderr
    # Cadence checkpoints are written in the background: the kill may land before step 20's commits.
    resumed = int(re.search(r"resumed from step_(\d+)\.bin", res.stderr).group(1))
    assert resumed in (10, 20)
    # Steps after it were trained twice (two segments); the newest entry per step is canonical and
    # equal to the first life's, because the trajectory is the same.
    first = {e["step"]: e["loss"] for e in entries(tmp_path) if e["segment"] == 1}
    second = {e["step"]: e["loss"] for e in entries(tmp_path) if e["segment"] == 2}
    assert min(second) == resumed + 1
    assert all(first[s] == second[s] for s in first if s in second)
    assert losses(tmp_path) == losses(continuous)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (continuous / bin_name(STEPS)).read_bytes()


@pytest.mark.parametrize("skipped", ["rng", "cursor"])
def test_negative_control_incomplete_restore_is_caught(
    tmp_path: Path, cache_dir: Path, continuous: Path, stopped: Path, skipped: str
) -> None:
    """The same comparison must FAIL when the resume skips a piece of state."""
    run = copy_of(stopped, tmp_path)
    res = run_trainer(
        run,
        cache_dir,
        "--max-steps",
        str(STEPS),
        "--checkpoint-every",
        "10",
        "--unsafe-skip-restore",
        skipped,
    )
    assert res.returncode == 0, res.stderr
    assert losses(run) != losses(continuous)
    assert (run / bin_name(STEPS)).read_bytes() != (continuous / bin_name(STEPS)).read_bytes()


def test_sigterm_during_startup_exits_cleanly(tmp_path: Path) -> None:
    """A SIGTERM while the corpus is being built (an empty cache: several seconds) is a prompt,
    clean exit, not a kill and not a wait until the first step."""
    t = Daemon(trainer_cmd(tmp_path / "run", tmp_path / "fresh-cache", "--max-steps", "5"))
    t.wait_for(r"building the default corpus")
    t0 = time.monotonic()
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert time.monotonic() - t0 < 3.0, t.log
    assert "stop requested during start-up" in t.log
    assert not list((tmp_path / "run").glob("step_*"))


def test_sigterm_during_sampling_checkpoints_promptly_and_logs_no_cut_off_sample(
    tmp_path: Path, cache_dir: Path
) -> None:
    """Three samples of 4,096 tokens (the most a sample may have) take far longer than the 3 s
    allowed below, so the SIGTERM sent once sampling started lands in it: the stop is honoured at
    once, and the samples it cut short are neither logged nor recorded."""
    (tmp_path / "run.toml").write_text('preset = "andrea-tiny"\n[samples]\nmax_new_tokens = 4096\n')
    t = Daemon(
        trainer_cmd(
            tmp_path,
            cache_dir,
            "--max-steps",
            "1000",
            "--checkpoint-every",
            "0",
            "--sample-every",
            "7",
        )
    )
    t.wait_for(r"generating samples at step 7")
    t0 = time.monotonic()
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert time.monotonic() - t0 < 3.0, t.log
    assert (tmp_path / bin_name(7)).exists(), t.log
    assert "samples of step 7 abandoned: stop requested" in t.log, t.log
    assert "sample at step 7" not in t.log, t.log


def test_failed_final_checkpoint_keeps_previous_and_exits_3(
    tmp_path: Path, cache_dir: Path, interrupted: Path
) -> None:
    """A real write failure: the process may not create files larger than 64 KiB (RLIMIT_FSIZE),
    less than one tiny-preset payload, so its final checkpoint fails like on a full disk. The run
    it resumes is the SIGINT test's, whose only checkpoint is the previous one."""
    run = copy_of(interrupted, tmp_path)
    (previous,) = sorted(int(p.stem[5:]) for p in run.glob("step_*.json"))
    before = (run / bin_name(previous)).read_bytes()

    def limit_file_size() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    t = Daemon(
        trainer_cmd(run, cache_dir, "--max-steps", "1000", "--checkpoint-every", "0"),
        preexec_fn=limit_file_size,
    )
    t.wait_for(rf"step {previous + 10}/")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.CHECKPOINT_FAILED, t.log
    assert "final checkpoint of step" in t.log and "FAILED" in t.log
    assert (run / bin_name(previous)).read_bytes() == before
    assert not list(run.glob("*.tmp")), "a failed write must not leave its temporary file"
    assert sorted(p.name for p in run.glob("step_*")) == [
        bin_name(previous),
        manifest_name(previous),
    ]
    # And the run resumes from it.
    res = run_trainer(run, cache_dir, "--max-steps", str(previous + 2), "--checkpoint-every", "0")
    assert res.returncode == 0 and f"resumed from {bin_name(previous)}" in res.stderr, res.stderr


def test_sigkill_during_checkpoint_writes_never_loads_a_torn_checkpoint(
    tmp_path: Path, cache_dir: Path, continuous: Path
) -> None:
    """A checkpoint every step, so that SIGKILLs at random moments land inside writes: every
    restart must resume from an intact checkpoint, and the run must still end bit-exact."""
    import random

    rng = random.Random(7)
    for _ in range(4):
        t = Daemon(
            trainer_cmd(tmp_path, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "1")
        )
        t.wait_for(r"checkpoint step_\d+\.bin written")
        time.sleep(rng.uniform(0.0, 0.3))
        t.signal(signal.SIGKILL)
        t.wait()
    res = run_trainer(tmp_path, cache_dir, "--max-steps", str(STEPS), "--checkpoint-every", "1")
    assert res.returncode == 0, res.stderr
    assert "resumed from" in res.stderr
    assert losses(tmp_path) == losses(continuous)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (continuous / bin_name(STEPS)).read_bytes()
