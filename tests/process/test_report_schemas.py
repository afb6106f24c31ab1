"""Every --json document of andreactl is in the schema registry, and real output validates against
the schema `andreactl schema COMMAND` prints for it: against a prepared run directory in-process,
and against live daemons (pivot, its cancel, checkpoint, stop, watch) in a process test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from andrea.daemon.rundir.layout import peer_endpoint
from andrea.protocol import messages
from andrea.protocol.transport import new_id, request
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.daemons import andreactl as ctl
from tests.support.reports import check

#: Seconds to wait for a daemon's log line: generous, for a loaded 2-core machine.
WAIT = 300


def interrupted_watch(cli: list[str]) -> str:
    """The first line of `andreactl watch`, which must then end on Ctrl-C with exit code 0. Should
    it not, its threads' tracebacks (faulthandler, on SIGABRT) are the failure's message."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    watch = subprocess.Popen(
        [*cli, "watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        line = watch.stdout.readline()
    finally:
        watch.send_signal(signal.SIGINT)
    try:
        code = watch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        watch.send_signal(signal.SIGABRT)
        _, err = watch.communicate(timeout=30)
        pytest.fail(f"watch did not end within 60 s of Ctrl-C; its stacks:\n{err[-8000:]}")
    assert code == 0, ("watch ends on Ctrl-C with exit code 0", watch.stderr.read()[-4000:])
    return line


def test_live_reports_validate(tmp_path: Path, cache_dir: Path, capsys) -> None:
    run = tmp_path / "run"
    t = Daemon(
        trainer_cmd(
            run, cache_dir, "--with-proxy", "--max-steps", "100000", "--checkpoint-every", "25"
        )
    )
    t.wait_for(r"step 3/", timeout=WAIT)

    def ok(*argv: str, code: int = 0) -> str:
        res = ctl(run, "--json", *argv, timeout=WAIT)
        assert res.returncode == code, (argv, res.stderr)
        return res.stdout

    assert check("status", ok("status"), capsys) == "StatusReport"
    cli = [sys.executable, "-m", "andrea.control.andreactl", "--run-dir", str(run), "--json"]
    assert check("watch", interrupted_watch(cli), capsys) == "StatusReport"
    assert check("checkpoint", ok("checkpoint", "--wait"), capsys) == "RequestReport"

    policy = tmp_path / "policy.toml"
    policy.write_text("[arms.code]\ncap = 0.5\n")
    assert (
        check("pivot", ok("pivot", "--policy", str(policy), "--dry-run"), capsys) == "PivotReport"
    )
    assert check("pivot", ok("pivot", "--policy", str(policy)), capsys) == "PivotReport"
    # A hold no pivot completes (as of a proxy that died mid-pivot): cancelled by the command.
    hold = messages.HoldRequest(id=new_id(), timeout_s=600)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(peer_endpoint(run, "trainer"))
    try:
        sock.send_multipart([b"", messages.encode(hold)])
        status = messages.StatusRequest(id=new_id())
        deadline = time.monotonic() + 60
        while request(peer_endpoint(run, "trainer"), status, timeout=10).data["hold"] is None:
            assert time.monotonic() < deadline, "the trainer never held: " + t.log[-3000:]
            time.sleep(0.05)
        cancelled = ok("pivot", "--cancel")
        assert check("pivot", cancelled, capsys) == "PivotCancelReport"
        assert json.loads(cancelled)["hold_id"] == hold.id
    finally:
        sock.close(linger=0)

    assert check("stop", ok("stop", "--wait"), capsys) == "RequestReport"
    assert t.wait() == 0, t.log
    assert check("status", ok("status", code=3), capsys) == "StatusReport"
    assert check("checkpoints", ok("checkpoints"), capsys) == "CheckpointsReport"
    assert check("prune", ok("prune", "--dry-run"), capsys) == "PruneReport"
