"""How far a start's encoding of its arms is: a log line at least every `LOG_EVERY_S` (bytes, documents,
rate, time left), and the same figures in ``andreactl status`` while the trainer starts.

The encoder reports after each batch and every few hundredths of a second while one is encoded
(daemon/data/encoding.py); the control thread reads `status()` when a status request comes. Bytes are
those read from the arm's files (for a ``.gz`` file, the compressed ones: what the total is made
of), or, for the embedded corpus (extracted in memory), those of its documents.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from andrea.daemon.data.sources import Meter
from andrea.daemon.runtime.progress import format_duration
from andrea.protocol.status import DataPreparation

log = logging.getLogger(__name__)

#: The most time between two progress lines of an encoding.
LOG_EVERY_S = 10.0
#: The most often `on_advance` is told (each time one datagram to systemd).
NOTIFY_EVERY_S = 1.0


class EncodingProgress:
    """The progress of the arm being encoded now (one at a time); thread-safe reads. `on_advance`
    hears the figures whenever they moved on, at most every `NOTIFY_EVERY_S` (the trainer tells
    systemd: daemon/runtime/sdnotify.py `Notifier.preparing`)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_advance: Callable[[DataPreparation], None] | None = None,
    ) -> None:
        self._clock = clock
        self._on_advance = on_advance
        self._lock = threading.Lock()
        self._now: DataPreparation | None = None
        self._meter: Meter | None = None
        self._started = self._logged = self._told = 0.0
        #: (time, bytes) of the first report: the rate counts from there, so that the documents
        #: a continued encoding skips (read, not encoded) do not make it look faster.
        self._base: tuple[float, int] | None = None
        self._figures = (0, 0)

    def start(self, arm: str, total_bytes: int, meter: Meter | None) -> None:
        """Arm `arm` starts encoding: `total_bytes` to read, counted by `meter` (None: by the
        encoder's document bytes)."""
        self._meter = meter
        self._started = self._logged = self._clock()
        self._told, self._base, self._figures = 0.0, None, (0, 0)
        with self._lock:
            self._now = DataPreparation(
                arm=arm, bytes_done=0, bytes_total=total_bytes, documents=0, elapsed_seconds=0.0
            )

    def update(self, document_bytes: int, documents: int) -> None:
        """The encoder's report (daemon/data/encoding.py `Progress`); logs when `LOG_EVERY_S` passed."""
        if self._now is None:
            return
        now = self._clock()
        done = self._meter.read if self._meter is not None else document_bytes
        if self._base is None:
            self._base = (now, done)
        took, since = now - self._base[0], done - self._base[1]
        total = self._now.bytes_total
        rate = since / took if took > 0 and since > 0 else None
        eta = (max(total - done, 0) / rate) if rate else None
        state = self._now.model_copy(
            update={
                "bytes_done": done,
                "documents": documents,
                "elapsed_seconds": round(now - self._started, 1),
                "bytes_per_second": round(rate, 1) if rate is not None else None,
                "eta_seconds": round(eta, 1) if eta is not None else None,
            }
        )
        with self._lock:
            self._now = state
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            log.info("%s", describe(state))
        figures = (done, documents)
        if self._on_advance is not None and figures != self._figures:
            if now - self._told >= NOTIFY_EVERY_S:
                self._figures, self._told = figures, now
                self._on_advance(state)

    def finish(self) -> None:
        with self._lock:
            self._now = None
        self._meter = None

    def status(self) -> DataPreparation | None:
        """What is being encoded now; None when nothing is."""
        with self._lock:
            return self._now


def describe(p: DataPreparation) -> str:
    """``arm web: encoding, 41% (110.2 of 270.0 MB read, 52,113 documents), 1.3 MB/s, about 2m03s
    left``: the progress line, and what ``andreactl status`` prints."""
    share = f"{min(p.bytes_done / p.bytes_total, 1):.0%} " if p.bytes_total else ""
    rate = f"{p.bytes_per_second / 1e6:.1f} MB/s" if p.bytes_per_second is not None else "? MB/s"
    left = format_duration(p.eta_seconds) if p.eta_seconds is not None else "?"
    return (
        f"arm {p.arm}: encoding, {share}({p.bytes_done / 1e6:.1f} of {p.bytes_total / 1e6:.1f} MB "
        f"read, {p.documents:,} documents), {rate}, about {left} left"
    )
