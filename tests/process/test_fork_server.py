"""The fork server the process tests start trainers with (tests/support/forkserver.py) must not
change what they prove: a forked trainer writes the same bytes as one started with exec, and is a
process of its own as far as the test can see (its pid, signals, exit status, streams,
environment, working directory and session)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from andrea.daemon.rundir.layout import DAEMON_MODULES, RUN_DIR_ENV
from tests.support import forkserver
from tests.support.daemons import Daemon, trainer_cmd

STEPS = ("--max-steps", "12", "--checkpoint-every", "6")


def _fork(cmd: list[str], **popen) -> forkserver.ForkedProcess:
    """A start through the fork server even under ANDREA_TESTS_EXEC=1: it is what is shown here."""
    return forkserver.ForkedProcess(cmd, DAEMON_MODULES["trainer"], **popen)


def _outputs(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.glob("step_*.bin"))}


def _completed(start, cmd: list[str]) -> subprocess.CompletedProcess:
    proc = start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=180)
    return subprocess.CompletedProcess(cmd, proc.wait(), out, err)


def _run(start, run: Path, cache: Path, *extra: str) -> None:
    res = _completed(start, trainer_cmd(run, cache, *STEPS, *extra))
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_forked_run_writes_the_bytes_of_an_exec_one(tmp_path: Path, cache_dir: Path) -> None:
    """Same flags: byte-identical checkpoints. Negative control: another seed, forked, differs,
    so the comparison can fail."""
    forked = tmp_path / "forked"
    _run(_fork, forked, cache_dir)
    exec_run = tmp_path / "exec"
    _run(subprocess.Popen, exec_run, cache_dir)
    assert set(_outputs(forked)) == {"step_000006.bin", "step_000012.bin"}
    assert _outputs(forked) == _outputs(exec_run)
    other = tmp_path / "other-seed"
    _run(_fork, other, cache_dir, "--seed", "7")
    assert _outputs(other)["step_000012.bin"] != _outputs(forked)["step_000012.bin"]


def test_a_forked_trainer_is_a_process_of_its_own(tmp_path: Path, cache_dir: Path) -> None:
    """Its pid answers signals: SIGTERM is a checkpoint and exit 0, SIGKILL ends it with -9; the
    environment, working directory and a new session are the caller's to give; a usage error
    exits 2 on its own stderr."""
    cmd = trainer_cmd(Path("unused"), cache_dir, "--max-steps", "100000")
    del cmd[cmd.index("--run-dir") : cmd.index("--run-dir") + 2]
    env = {**os.environ, RUN_DIR_ENV: "relative-run"}
    d = Daemon(cmd, env=env, cwd=tmp_path, start_new_session=True, start=_fork)
    d.wait_for(r"step 2/")
    assert os.getsid(d.proc.pid) == d.proc.pid != os.getsid(0)
    assert Path(f"/proc/{d.proc.pid}/cwd").resolve() == tmp_path.resolve()
    assert (tmp_path / "relative-run" / ".loss.json").is_file()
    assert d.proc.poll() is None
    d.signal(signal.SIGTERM)
    assert d.wait() == 0
    assert "(sigterm" in d.log and list((tmp_path / "relative-run").glob("step_*.bin"))
    killed = Daemon(trainer_cmd(tmp_path / "k", cache_dir, "--max-steps", "100000"), start=_fork)
    killed.wait_for(r"step 2/")
    killed.signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    usage = _completed(_fork, trainer_cmd(tmp_path / "r", cache_dir, "--max-steps", "nine"))
    assert usage.returncode == 2 and "--max-steps" in usage.stderr, usage.stderr
    # Byte for byte what an exec'd trainer says, nothing of the server's before it (runpy's
    # warning of a module imported twice, once).
    exec_d = _completed(subprocess.Popen, usage.args)
    assert (usage.returncode, usage.stdout, usage.stderr) == (
        exec_d.returncode,
        exec_d.stdout,
        exec_d.stderr,
    )
