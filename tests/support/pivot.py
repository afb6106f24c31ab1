"""A running pivot's parts, shared by the pivot tests: the proxy, andreactl (blocking and in the
background), the trainer's status and its hold."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from andrea.daemon.rundir.layout import endpoint
from andrea.protocol import messages
from andrea.protocol.transport import new_id, request
from tests.support.daemons import Daemon, andreactl

# Caps of 0 leave docstrings as the only arm: every step after the pivot must come from it.
POLICY = "[arms.code]\ncap = 0.0\n[arms.comments]\ncap = 0.0\n"


def proxy(run_dir: Path, env: dict[str, str] | None = None) -> Daemon:
    return Daemon(
        [sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run_dir)], env=env
    )


def ctl(run_dir: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return andreactl(run_dir, *args, timeout=timeout)


def ctl_bg(run_dir: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "andrea.control.andreactl", "--run-dir", str(run_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(p: Daemon) -> int:
    p.signal(signal.SIGTERM)
    return p.wait()


def trainer_status(run_dir: Path) -> dict:
    reply = request(endpoint(run_dir, "trainer"), messages.StatusRequest(id=new_id()), timeout=5)
    return reply.data


def wait_hold(run_dir: Path, state: str | tuple[str, ...], timeout: float = 120) -> dict:
    """The trainer's hold once it is in `state` (one of them); "holding" only once acknowledged."""
    states = (state,) if isinstance(state, str) else state
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        hold = trainer_status(run_dir)["hold"]
        if (
            hold is not None
            and hold["state"] in states
            and (hold["state"] != "holding" or hold["acknowledged"])
        ):
            return hold
        time.sleep(0.02)
    raise AssertionError(f"the trainer never reached hold state {state!r}")
