"""The tests' shared helpers for real daemons: the test trainer's command line, a daemon
subprocess whose log lines can be awaited, and `andreactl` in a fresh interpreter."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.support import forkserver

REPO = Path(__file__).resolve().parents[2]

# Every Daemon started, so that tests/conftest.py kills what a failing test left running.
LIVE: list[subprocess.Popen | forkserver.ForkedProcess] = []


def trainer_args(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    """The arguments of a small, quiet test trainer: andrea-tiny, one thread, no samples."""
    return [
        "--run-dir",
        str(run_dir),
        "--preset",
        "andrea-tiny",
        "--threads",
        "1",
        "--cache-dir",
        str(cache),
        "--log-every",
        "1",
        "--sample-every",
        "0",
        *extra,
    ]


def trainer_cmd(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "andrea.daemon.trainer.service.cli",
        *trainer_args(run_dir, cache, *extra),
    ]


class Daemon:
    """A daemon subprocess (trainer or proxy) whose log lines can be awaited while it runs."""

    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str] | None = None,
        start: Callable[..., subprocess.Popen | forkserver.ForkedProcess] = forkserver.start,
        **popen,
    ) -> None:
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self.proc = start(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            **popen,
        )
        LIVE.append(self.proc)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        with self.proc.stderr:  # closed at its end: an open pipe would be a ResourceWarning
            for line in self.proc.stderr:
                self.lines.append(line)
                self._q.put(line)
        self._q.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None:
                raise AssertionError(f"the process exited before {pattern!r}:\n{self.log}")
            if line and (m := rx.search(line)):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {pattern!r}:\n{self.log}")

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 120) -> int:
        code = self.proc.wait(timeout)
        time.sleep(0.05)  # let the pump thread drain stderr
        return code

    @property
    def log(self) -> str:
        return "".join(self.lines)


def andreactl(
    run_dir: Path | None, *args: str, timeout: float = 120, **run
) -> subprocess.CompletedProcess:
    """`andreactl [--run-dir RUN_DIR] ARGS` in a fresh interpreter, as an operator's shell runs it."""
    pre = ["--run-dir", str(run_dir)] if run_dir else []
    return subprocess.run(
        [sys.executable, "-m", "andrea.control.andreactl", *pre, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **run,
    )


def run_trainer(
    run_dir: Path, cache: Path, *extra: str, timeout: float = 180
) -> subprocess.CompletedProcess:
    return forkserver.run(trainer_cmd(run_dir, cache, *extra), text=True, timeout=timeout)
