"""Nothing a second start, a copy of a run or a stray pid can do harms a live run (issue 50, H1, H2,
M2 and M4): who owns a run directory or a cache entry is judged from the lock that is held, never
from a pid written in a file.

A live run here is what the units run: a proxy and a trainer without `--with-proxy`, each its own
process. Against it:

- a second `andrea-trainer --with-proxy` is refused (exit 2) and leaves the live proxy alone (it
  used to adopt it on its way out and SIGTERM it, and the live trainer then waited for a proxy);
- a copy (`cp -r`, its lock files naming the live processes) trains as a fork of the run, with a
  proxy of its own, and stops without signalling the original's (it used to adopt the original's
  proxy, wait forever, and SIGTERM it when stopped; with a proxy of its own it was refused, exit 2,
  because the copied `.state.json` names the original's live trainer);
- a run sharing a cache with an encoder in another pid namespace leaves its temporary alone (it
  used to judge the temporary's pid dead and remove it, and the encoder failed with exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import STATE_FILE, bin_name, parse_checkpoint_name
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.owndata import PROSE, bpe_file

WAIT = 120
TEXT_ARM = '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.txt"]\n'


class LiveRun:
    """A run trained as the units train it: a proxy and a trainer, two processes."""

    def __init__(self, run: Path, cache: Path) -> None:
        self.run = run
        self.proxy = Daemon(
            [sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run)]
        )
        self.trainer = Daemon(
            trainer_cmd(run, cache, "--mixing", "proxy", "--max-steps", "100000",
                        "--checkpoint-every", "5")
        )  # fmt: skip

    def step(self) -> int:
        return max(e.step for e in read_entries(self.run / ".loss.json"))

    def still_trains(self) -> None:
        """Both processes live, and the trainer's steps go on through the same proxy."""
        assert self.proxy.proc.poll() is None, self.proxy.log
        assert self.trainer.proc.poll() is None, self.trainer.log
        self.trainer.wait_for(rf"step {self.step() + 3}/", WAIT)
        assert self.proxy.proc.poll() is None, self.proxy.log


def test_a_second_start_and_a_copy_leave_a_live_run_alone(tmp_path: Path, cache_dir: Path) -> None:
    """One live run for both (a start is the most of this test's time)."""
    live = LiveRun(tmp_path / "run", cache_dir)
    live.trainer.wait_for(r"checkpoint step_000005\.bin written", WAIT)
    _second_start_is_refused_and_touches_nothing(live, cache_dir)
    _copy_is_a_fork_that_leaves_the_original_alone(live, tmp_path / "copy", cache_dir)
    for daemon in (live.trainer, live.proxy):  # the trainer first: its records reach the proxy
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(WAIT) == ExitCode.OK, daemon.log
    curve = canonical_curve(read_entries(live.run / ".loss.json"))
    assert [e.step for e in curve] == list(range(1, len(curve) + 1))


def _second_start_is_refused_and_touches_nothing(live: LiveRun, cache_dir: Path) -> None:
    second = forkserver.run(
        trainer_cmd(live.run, cache_dir, "--with-proxy", "--max-steps", "100000"),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert second.returncode == ExitCode.CONFIG_ERROR, second.stderr
    assert f"another andrea-trainer (pid {live.trainer.proc.pid}) is running" in second.stderr
    assert "started by hand" not in second.stderr, "it took the live run's proxy for its own"
    live.still_trains()


def _copy_is_a_fork_that_leaves_the_original_alone(
    live: LiveRun, copy: Path, cache_dir: Path
) -> None:
    # Paused for the copy, so that cp copies one moment of the run (a file copied while the trainer
    # writes the next is another matter); the processes live on, their lock files copied with it.
    live.trainer.signal(signal.SIGSTOP)
    time.sleep(0.3)
    try:
        subprocess.run(["cp", "-r", str(live.run), str(copy)], check=True, timeout=WAIT)
    finally:
        live.trainer.signal(signal.SIGCONT)
    assert (copy / ".proxy.lock").read_text() == str(live.proxy.proc.pid)
    manifests = [parse_checkpoint_name(p.name) for p in copy.glob("step_*.json")]
    resumed = max((m[0] for m in manifests if m is not None), default=0)
    segments = json.loads((copy / STATE_FILE).read_text())["max_segment"]

    fork = Daemon(trainer_cmd(copy, cache_dir, "--with-proxy", "--max-steps", str(resumed + 2)))
    try:
        code = fork.wait(WAIT)
    except subprocess.TimeoutExpired:  # it took the original's proxy for its own, and waits on it
        fork.signal(signal.SIGTERM)
        code = fork.wait(WAIT)
    live.still_trains()
    assert code == ExitCode.OK, fork.log
    assert "started by hand" not in fork.log and "starting andrea-proxy" in fork.log
    assert f"trainer segment {segments + 1} connected" in fork.log, fork.log
    assert (copy / bin_name(resumed + 2)).exists()
    forked = {e.step: e.segment for e in canonical_curve(read_entries(copy / ".loss.json"))}
    assert [forked[step] for step in (resumed + 1, resumed + 2)] == [segments + 1] * 2


#: `sh -c` of this, under `unshare -Urpf`, runs `$2...` in a new user and pid namespace as pid `$1` + 1
#: (one no process has out here): a container, or a job's other node, sharing a cache.
_IN_ANOTHER_PID_NAMESPACE = 'echo "$1" > /proc/sys/kernel/ns_last_pid && shift && "$@"; exit $?'


def _free_pid() -> int:
    """A pid no process has here, after which the other namespace numbers its command."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(n for n in range(top - 2, 300, -1) if not Path(f"/proc/{n + 1}").exists())


def _text_run(run: Path, files: int, size: int, extra: str = "") -> Path:
    (run / "notes").mkdir(parents=True)
    for i in range(files):
        (run / "notes" / f"n{i}.txt").write_text(f"{i} " + (PROSE + "\n") * (size // len(PROSE)))
    (run / "run.toml").write_text(extra + TEXT_ARM)
    return run


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_an_encoder_in_another_pid_namespace_keeps_its_temporaries(tmp_path: Path) -> None:
    pid = _free_pid()
    probe = subprocess.run(
        ["unshare", "-Urpf", "--mount-proc", "sh", "-c", _IN_ANOTHER_PID_NAMESPACE, "sh", str(pid),
         "true"],
        capture_output=True,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"a user and pid namespace cannot be made here: {probe.stderr!r}")
    cache = tmp_path / "cache"
    cache.mkdir()
    # A subword tokenizer on one thread encodes slowly enough (1 to 3 MB/s) to be caught mid-write.
    first = _text_run(tmp_path / "first", 6, 300_000, '[data]\ntokenizer = "tokenizer.json"\n')
    bpe_file(first / "tokenizer.json", [PROSE * 10])
    encoder = Daemon(
        ["unshare", "-Urpf", "--mount-proc", "sh", "-c", _IN_ANOTHER_PID_NAMESPACE, "sh", str(pid),
         *trainer_cmd(first, cache, "--max-steps", "2")],
        env={"RAYON_NUM_THREADS": "1"},
        start_new_session=True,
    )  # fmt: skip
    # An encoding grows its files as FILE.partial (kept for the next start if it is stopped:
    # daemon/data/partial.py); the cache's other writes go through NAME.<pid>.tmp.
    while not (writing := [*cache.glob("*.partial"), *cache.glob("*.tmp")]):
        assert encoder.proc.poll() is None, encoder.log
        time.sleep(0.002)
    os.killpg(encoder.proc.pid, signal.SIGSTOP)  # held mid-write while the other run starts
    try:
        temporaries = [p for p in writing if p.suffix == ".tmp"]
        assert {p.name.rsplit(".", 2)[-2] for p in temporaries} <= {str(pid + 1)}, writing
        second = Daemon(trainer_cmd(_text_run(tmp_path / "second", 4, 8_000), cache,
                                    "--max-steps", "1"))  # fmt: skip
        assert second.wait(WAIT) == ExitCode.OK, second.log
        assert "token cache: removed" not in second.log
        assert all(p.exists() for p in writing), "the other run removed a live temporary"
    finally:
        os.killpg(encoder.proc.pid, signal.SIGCONT)
    assert encoder.wait(WAIT) == ExitCode.OK, encoder.log
    assert (first / bin_name(2)).exists() and not list(cache.glob("*.tmp"))
    assert not list(cache.glob("*.partial")), "the finished encoding left its partial files"
