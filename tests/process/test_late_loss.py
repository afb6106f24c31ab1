"""A step's loss is read one step late between log points (daemon/trainer/loop.py), so that on a
GPU the host queues the next step before it waits for the last. Signals must still act at the
boundary they arrive at: a checkpoint or a stop there holds that step, with every step up to it
already in .loss.json, and the resume ends on the bytes of the run never stopped."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

from andrea.daemon.rundir.layout import bin_name, manifest_name
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 80
# No log point, checkpoint, evaluation or sample before the end: every loss is read late.
QUIET = ("--max-steps", str(STEPS), "--checkpoint-every", "0", "--log-every", str(STEPS))


def recorded(run_dir: Path) -> list[int]:
    path = run_dir / ".loss.json"
    try:
        return [e["step"] for e in json.loads(path.read_text())]
    except (FileNotFoundError, json.JSONDecodeError):  # not created yet, or mid-append
        return []


def wait_for_records(run_dir: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(recorded(run_dir)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} records after {timeout} s"
        time.sleep(0.01)


def test_signals_between_log_points_act_at_their_boundary(tmp_path: Path, cache_dir: Path) -> None:
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    assert run_trainer(whole, cache_dir, *QUIET).returncode == 0

    t = Daemon(trainer_cmd(stopped, cache_dir, *QUIET))
    wait_for_records(stopped, 5)
    t.signal(signal.SIGUSR1)
    usr1 = int(t.wait_for(r"checkpoint step_0*(\d+)\.bin written \(sigusr1").group(1))
    # The manifest commits after the loss log is durable: every step up to it is there.
    assert recorded(stopped)[:usr1] == list(range(1, usr1 + 1))
    wait_for_records(stopped, usr1 + 5)
    t.signal(signal.SIGTERM)
    assert t.wait() == 0, t.log
    (at,) = {int(s) for s in re.findall(r"stopped at step (\d+)", t.log)}
    assert usr1 < at < STEPS, t.log
    final = json.loads((stopped / manifest_name(at)).read_text())
    assert final["trigger"] == "sigterm" and final["progress"]["step"] == at
    assert recorded(stopped) == list(range(1, at + 1))

    assert run_trainer(stopped, cache_dir, *QUIET).returncode == 0
    assert recorded(stopped) == recorded(whole) == list(range(1, STEPS + 1))
    assert (stopped / bin_name(STEPS)).read_bytes() == (whole / bin_name(STEPS)).read_bytes()
    by_step = {e["step"]: e for e in json.loads((whole / ".loss.json").read_text())}
    for e in json.loads((stopped / ".loss.json").read_text()):
        w = by_step[e["step"]]
        assert (e["loss"], e["batch_sha256"]) == (w["loss"], w["batch_sha256"])
