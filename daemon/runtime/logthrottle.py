"""Warnings about what peers send, limited in rate: a flood of invalid messages must not become a
flood of log lines (5,018 WARNING lines from one flood before this existed) nor cost the daemon
the time to write them."""

from __future__ import annotations

import logging
import time


class ThrottledWarning:
    """Logs at most `burst` warnings per `period` seconds; the ones it drops are counted and the
    count is reported with the next warning that gets through."""

    def __init__(self, log: logging.Logger, burst: int = 5, period: float = 10.0) -> None:
        self.log = log
        self.burst = burst
        self.period = period
        self._window_start = -float("inf")
        self._in_window = 0
        self._dropped = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= self.period:
            self._window_start, self._in_window = now, 0
        if self._in_window >= self.burst:
            self._dropped += 1
            return
        self._in_window += 1
        if self._dropped:
            msg += " (%d similar warnings suppressed)"
            args = (*args, self._dropped)
            self._dropped = 0
        self.log.warning(msg, *args)
