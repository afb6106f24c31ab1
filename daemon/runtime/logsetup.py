"""Where a daemon's log goes: the journal under systemd, stderr otherwise, with the level the
operator asked for.
"""

from __future__ import annotations

import logging
import os

#: Set by `andrea-trainer --with-proxy` for its proxy: both write to one terminal, and every line
#: says which process wrote it.
LOG_TAG_ENV = "ANDREA_LOG_TAG"


def setup_logging(
    level: str, identifier: str = "andrea-trainer", tag: str | None = None, rank: int | None = None
) -> None:
    """journald with structured fields under systemd, plain stderr lines elsewhere, prefixed with
    ``[tag]`` when ``tag`` (or $ANDREA_LOG_TAG) is set. `rank`: the global rank of a torchrun
    worker, which tags its lines, in the journal too (a job's workers share one unit)."""
    handler: logging.Handler
    prefix = f"[rank {rank}] " if rank is not None else ""
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        try:
            from systemd.journal import JournalHandler

            handler = JournalHandler(SYSLOG_IDENTIFIER=identifier)
            # The journal has its own time, priority and logger fields: MESSAGE is the message
            # alone (basicConfig would otherwise prefix "INFO:logger:").
            handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
        except ImportError:
            handler = logging.StreamHandler()
    else:
        handler = logging.StreamHandler()
        tag = tag or os.environ.get(LOG_TAG_ENV) or (f"rank {rank}" if rank is not None else None)
        prefix = f"[{tag}] " if tag else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
        )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
