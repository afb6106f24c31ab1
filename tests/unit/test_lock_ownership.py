"""Who holds a run directory or a cache entry is the lock that is held, never a pid written in a file
(issue 50, H1, H2, M2, M4): a copied lock file, which names a live process, holds nothing; a
temporary whose writer holds its entry's lock is kept whatever its pid. In this process: a flock
taken through one open file conflicts with a probe through another, as another process's does."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from andrea.daemon.data.tokencache import entry_lock, remove_stale_temporaries
from andrea.daemon.rundir.layout import (
    claim,
    lock_holder,
    lock_path,
    signal_holder,
)


@pytest.fixture
def usr2() -> Iterator[list[int]]:
    """The SIGUSR2s this process receives while the test runs."""
    got: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    previous = signal.signal(signal.SIGUSR2, handler)
    yield got
    signal.signal(signal.SIGUSR2, previous)


def test_a_copied_lock_names_a_live_pid_and_holds_nothing(tmp_path: Path, usr2: list[int]) -> None:
    run, copy = tmp_path / "run", tmp_path / "copy"
    run.mkdir()
    lock = claim(run, "proxy")
    shutil.copytree(run, copy)
    assert lock_path(copy, "proxy").read_text() == str(os.getpid())
    assert lock_holder(run, "proxy") == os.getpid()
    assert lock_holder(copy, "proxy") is None
    assert not signal_holder(copy, "proxy", os.getpid(), signal.SIGUSR2)
    assert usr2 == []
    assert signal_holder(run, "proxy", os.getpid(), signal.SIGUSR2)
    assert usr2 == [signal.SIGUSR2]
    assert not signal_holder(run, "proxy", os.getpid() + 1, signal.SIGUSR2)  # not the holder
    lock.close()
    assert lock_holder(run, "proxy") is None  # released: the pid it names is no holder
    assert not signal_holder(run, "proxy", os.getpid(), signal.SIGUSR2)
    assert usr2 == [signal.SIGUSR2]


def test_a_claim_outwaits_a_probe(tmp_path: Path) -> None:
    """A probe (`lock_holder`, andreactl status) holds the lock shared for an instant; a daemon
    claiming it then waits the instant out instead of taking the probe for another daemon."""
    probe = os.open(lock_path(tmp_path, "trainer"), os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(probe, fcntl.LOCK_SH)
    threading.Timer(0.1, os.close, (probe,)).start()
    claim(tmp_path, "trainer").close()


def test_a_temporary_is_kept_while_its_entry_is_locked(tmp_path: Path) -> None:
    # A pid no process has here: another pid namespace's writer, or a writer killed mid-write.
    temporary = tmp_path / "0a1b.u16.4000000.tmp"
    temporary.write_bytes(b"half written")
    with entry_lock(tmp_path, "0a1b", "notes", exclusive=True):
        remove_stale_temporaries(tmp_path)
        assert temporary.exists(), "removed under its live writer"
    remove_stale_temporaries(tmp_path)
    assert not temporary.exists(), "a killed writer's temporary stays"
