"""Where an error goes under systemd: through stderr when stderr is the unit's journal stream, with
the priority prefix journald reads (a native datagram from a process that exits at once can lose
its unit: see daemon/runtime/logsetup.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

from andrea.daemon.runtime.logsetup import setup_logging


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def journal_stream_of_fd2() -> str:
    st = os.fstat(2)
    return f"{st.st_dev}:{st.st_ino}"


def test_errors_take_the_journal_stream_with_their_priority(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    pytest.importorskip("systemd.journal")
    monkeypatch.setenv("JOURNAL_STREAM", journal_stream_of_fd2())
    setup_logging("INFO", rank=3)
    log = logging.getLogger("andrea.test")
    log.error("unknown preset 'x'")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.critical("gave up", exc_info=True)
    err = capfd.readouterr().err.splitlines()
    assert err[0] == "<3>[rank 3] unknown preset 'x'"
    assert err[1] == "<2>[rank 3] gave up"
    # Every line of a traceback keeps the priority: journald reads the prefix line by line.
    assert err[-1] == "<2>RuntimeError: boom" and all(line.startswith("<2>") for line in err[1:])


def test_another_stderr_under_systemd_keeps_errors_in_the_journal(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    journal = pytest.importorskip("systemd.journal")
    monkeypatch.setenv("JOURNAL_STREAM", "1:1")  # StandardError= elsewhere: not fd 2
    setup_logging("INFO")
    handlers = logging.getLogger().handlers
    assert [type(h) for h in handlers] == [journal.JournalHandler]
    assert handlers[0].filter(logging.makeLogRecord({"levelno": logging.ERROR}))


def test_without_systemd_errors_are_plain_lines(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, root_logging: None
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    setup_logging("INFO", tag="proxy")
    logging.getLogger("andrea.test").error("no such run")
    (line,) = capfd.readouterr().err.splitlines()
    assert line.endswith(" [proxy] ERROR no such run") and not line.startswith("<")
