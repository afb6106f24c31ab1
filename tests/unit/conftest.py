"""The fast tier starts no process: while a test under tests/unit/ runs, starting a child
(subprocess, fork, posix_spawn, os.system, multiprocessing) fails with the way out."""

from __future__ import annotations

import multiprocessing.util
import os
import subprocess

# matplotlib builds its font cache with `fc-list` the first time it is imported on a machine (a
# fresh CI machine: whichever unit test imported it first failed). A library's one-time setup, done
# here before any test runs, not a process a test starts.
import matplotlib.font_manager  # noqa: F401
import pytest

MOVE = "tests/unit/ starts no process: a test that starts {what} belongs in tests/process/"


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise AssertionError(MOVE.format(what=what))

    return refused


@pytest.fixture(autouse=True)
def _no_child_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way the standard library starts a child goes through one of these: Popen (hence
    subprocess.run and asyncio's subprocesses), fork, posix_spawn(p), system, and
    multiprocessing's spawn and forkserver starts (which fork-exec through spawnv_passfds)."""
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("a subprocess"))
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse("a multiprocessing child"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"a child (os.{name})"))
