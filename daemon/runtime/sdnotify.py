"""systemd's notification socket: READY, STATUS, the watchdog's keep-alive, EXTEND_TIMEOUT and
STOPPING, or nothing when not under systemd.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


#: How long the stop timeout is extended at most while one final checkpoint is being written.
EXTEND_LIMIT = 3600.0
#: How much more time to start each sign of a start's progress asks for (each step of the start,
#: and, at most every second, an encoding that advances: a first start's encoding may take longer
#: than any TimeoutStartSec): a start that shows none for this long, past the unit's
#: TimeoutStartSec, ends in the start's timeout as before.
START_EXTEND_S = 300.0


try:
    from systemd import daemon as _sd
except ImportError:  # off Linux, or a machine where it could not be built (scripts/gpu_wheels.sh)
    _sd = None


@functools.cache
def _no_notifications() -> None:
    log.warning(
        "started by systemd, but systemd-python is not installed: no readiness, status or "
        "watchdog notifications (a Type=notify unit will time out)"
    )


class Notifier:
    def __init__(self, enabled: bool = True) -> None:
        """`enabled=False` for the ranks of a torchrun job other than global rank 0: they inherit
        NOTIFY_SOCKET from the agent, but one voice (rank 0's) speaks for the job."""
        wanted = bool(enabled and os.environ.get("NOTIFY_SOCKET"))
        if wanted and _sd is None:
            _no_notifications()
        self.enabled = wanted and _sd is not None
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0) if self.enabled else 0
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

    def preparing(self, status: str) -> None:
        """The start moved on (`status` says how far): STATUS=, and EXTEND_TIMEOUT_USEC of
        `START_EXTEND_S`, so that a first start encoding a large corpus for longer than the
        unit's TimeoutStartSec is not killed and restarted half-way. Before READY=1 only."""
        self._send(f"EXTEND_TIMEOUT_USEC={int(START_EXTEND_S * 1e6)}", f"STATUS={status}")

    def extend_timeout(self, seconds: float) -> None:
        """Ask systemd for `seconds` more from now to finish stopping."""
        self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    @contextlib.contextmanager
    def keepalive(
        self, what: str, extend: float | None = None, limit: float = EXTEND_LIMIT
    ) -> Iterator[None]:
        """While the body runs (a checkpoint write that blocks the main thread), keep systemd
        informed from a helper thread: WATCHDOG=1, and with `extend` an EXTEND_TIMEOUT_USEC of
        that many seconds, re-sent every `extend`/3 s for at most `limit` seconds. One extension
        alone would lapse during a write slower than it, and systemd would SIGKILL a clean stop
        half-way; the limit still lets systemd end a write that hangs for good (a dead disk)."""
        if not self.enabled:
            yield
            return
        period = min(x for x in (extend and extend / 3, self._watchdog_every or None, 10.0) if x)
        done = threading.Event()
        start = time.monotonic()

        def beat() -> None:
            next_log = 60.0
            while True:
                if extend and time.monotonic() - start < limit:
                    self.extend_timeout(extend)
                if self._watchdog_every:
                    self._send("WATCHDOG=1")
                if done.wait(period):
                    return
                waited = time.monotonic() - start
                self._send(f"STATUS={what} ({waited:.0f} s so far)")
                if waited >= next_log:
                    log.info("%s: still in progress after %.0f s", what, waited)
                    next_log += 60.0

        t = threading.Thread(target=beat, name="sd-keepalive", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join()

    def stopping(self) -> None:
        # Final from systemd 259 on: only at the real exit, never for checkpoint-and-continue.
        self._send("STOPPING=1")
