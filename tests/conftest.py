"""Shared fixtures: real daemon processes (trainers and proxies) in temporary run directories."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _default_cache_outside_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The default token cache (`$XDG_CACHE_HOME/andrea`), which `andreactl tokenizer train` warms
    when a test gives no --cache-dir, lies in the session's temporary directory, never in $HOME."""
    if "XDG_CACHE_HOME" not in os.environ:
        os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tokenized-corpus cache for the whole session: the first trainer builds it."""
    shared = os.environ.get("ANDREA_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("cache")


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


def pytest_configure(config: pytest.Config) -> None:
    """With -n: each test file on one worker, so a file's module fixtures (a reference run trained
    once for its tests) are built once, not once per worker. Set here rather than in addopts,
    where `--dist` would stop a pytest without pytest-xdist from starting; an explicit --dist wins."""
    explicit = any(a.startswith(("--dist", "-d")) for a in config.invocation_params.args)
    if config.pluginmanager.hasplugin("xdist") and not explicit:
        if config.getoption("dist", "no") == "load":
            config.option.dist = "loadfile"


_LIVE: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """A failing test must not leave a daemon running into the next test (or past CI)."""
    yield
    while _LIVE:
        proc = _LIVE.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Daemon:
    """A daemon subprocess (trainer or proxy) whose log lines can be awaited while it runs."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, **popen) -> None:
        self.lines: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            **popen,
        )
        _LIVE.append(self.proc)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
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
    return subprocess.run(
        trainer_cmd(run_dir, cache, *extra), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def real_systemd(tmp_path_factory: pytest.TempPathFactory):
    """A real systemd booted once for the module, PID 1 of private namespaces, with the units
    installed by scripts/install-units.sh (tests/support/realsystemd.py); killed at the end. Skips, with
    the reason, where it cannot boot (no root, no unshare, no systemd)."""
    from .support.realsystemd import SystemdMachine, unavailable

    if why := unavailable():
        pytest.skip(why)
    machine = SystemdMachine(tmp_path_factory.mktemp("systemd"))
    machine.boot()
    try:
        yield machine
    finally:
        machine.kill()


@pytest.fixture(scope="session")
def audited_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A finished real run with two restarts, a pivot, a zombie arm and an audit checkpoint
    (tests/support/audited_run.py). Shared and read-only: a test that changes it copies it first."""
    from .support.audited_run import make_audited_run

    return make_audited_run(tmp_path_factory.mktemp("audited"), cache_dir)
