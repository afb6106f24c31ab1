"""Where a daemon's log goes: the journal under systemd, stderr otherwise, with the level the
operator asked for.
"""

from __future__ import annotations

import logging
import os
import sys

#: Set by `andrea-trainer --with-proxy` for its proxy: both write to one terminal, and every line
#: says which process wrote it.
LOG_TAG_ENV = "ANDREA_LOG_TAG"


def setup_logging(
    level: str, identifier: str = "andrea-trainer", tag: str | None = None, rank: int | None = None
) -> None:
    """journald with structured fields under systemd, plain stderr lines elsewhere, prefixed with
    ``[tag]`` when ``tag`` (or $ANDREA_LOG_TAG) is set. `rank`: the global rank of a torchrun
    worker, which tags its lines, in the journal too (a job's workers share one unit)."""
    handlers: list[logging.Handler]
    prefix = f"[rank {rank}] " if rank is not None else ""
    under_systemd = os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID")
    journal = _journal_handler(identifier, prefix) if under_systemd else None
    if journal is not None and _stderr_is_the_journal():
        journal.addFilter(lambda record: record.levelno < logging.ERROR)
        handlers = [journal, _fatal_stream_handler(prefix)]
    elif journal is not None:
        handlers = [journal]
    else:
        handler = logging.StreamHandler()
        tag = tag or os.environ.get(LOG_TAG_ENV) or (f"rank {rank}" if rank is not None else None)
        prefix = f"[{tag}] " if tag else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
        )
        handlers = [handler]
    logging.basicConfig(level=level.upper(), handlers=handlers, force=True)


def _journal_handler(identifier: str, prefix: str) -> logging.Handler | None:
    """Records in journald's native protocol, so that progress lines keep their STEP=, LOSS=, …
    fields; None without systemd-python."""
    try:
        from systemd.journal import JournalHandler
    except ImportError:
        return None
    handler = JournalHandler(SYSLOG_IDENTIFIER=identifier)
    # The journal has its own time, priority and logger fields: MESSAGE is the message alone
    # (basicConfig would otherwise prefix "INFO:logger:").
    handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    return handler


def _stderr_is_the_journal() -> bool:
    """Whether stderr is the stream systemd connected to the journal: $JOURNAL_STREAM names its
    device and inode (systemd.exec(5)), and a unit with StandardError= elsewhere has another."""
    try:
        device, inode = (int(n) for n in os.environ.get("JOURNAL_STREAM", "").split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


class _PriorityFormatter(logging.Formatter):
    """sd-daemon(3)'s "<N>" priority prefix on every line, which journald reads off a stream."""

    def format(self, record: logging.LogRecord) -> str:
        priority = 2 if record.levelno >= logging.CRITICAL else 3
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def _fatal_stream_handler(prefix: str) -> logging.Handler:
    """ERROR and CRITICAL records through stderr, the stream systemd connected to the journal.

    An error is most often a process's last words: the daemon exits with its code right after.
    journald attributes a native datagram to its unit by reading the sender's /proc/PID/cgroup,
    which a process that has already exited no longer has (systemd issue #2913, open since 2016),
    so `journalctl -u andrea-trainer@RUN` would miss the one line saying why the unit failed. A
    stream carries its unit from the moment systemd opened it, whoever is still alive."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(_PriorityFormatter(prefix + "%(message)s"))
    return handler
