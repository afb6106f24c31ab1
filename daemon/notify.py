"""systemd notification (Type=notify): readiness, status, watchdog, stop-timeout extension.

Does nothing when not started by systemd (no NOTIFY_SOCKET), so the daemons run the same way in
a terminal, in tests and under a unit.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

try:
    from systemd import daemon as _sd
except ImportError:  # systemd-python is optional off Linux
    _sd = None


class Notifier:
    def __init__(self) -> None:
        self.enabled = bool(_sd is not None and os.environ.get("NOTIFY_SOCKET"))
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0)
        # Ping at half the watchdog interval, as sd_watchdog_enabled(3) recommends.
        self._watchdog_every = usec / 2e6 if usec else 0.0
        self._last_ping = 0.0

    def _send(self, *fields: str) -> None:
        if self.enabled:
            _sd.notify("\n".join(fields))

    def ready(self, status: str) -> None:
        self._send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def tick(self) -> None:
        """Watchdog keep-alive; cheap to call often, sends at most every WATCHDOG_USEC/2."""
        if self._watchdog_every:
            now = time.monotonic()
            if now - self._last_ping >= self._watchdog_every:
                self._last_ping = now
                self._send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask systemd for more time to finish stopping (resent while the final checkpoint is written)."""
        self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def stopping(self) -> None:
        # Final from systemd 259 on: only at the real exit, never for checkpoint-and-continue.
        self._send("STOPPING=1")
