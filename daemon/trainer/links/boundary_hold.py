"""The trainer's pivot hold: one identified hold at a time, released only by its own identity.

A pivot asks the trainer to checkpoint at its next cadence boundary and wait there while the proxy
starts a new phase. Three things made that unsafe when the hold was an anonymous flag: a client
could take another client's (or a stale) hold for its own, a resume meant for one pivot released
another, and a client killed between hold and resume left the trainer waiting forever. So a hold
carries the id of the request that asked for it, the step it was asked at (the boundary is always
after it), the requesting client's pid, and a timeout; a resume must name it, a second hold request
is refused while one is pending or active, and status shows its state and age.

Shared by the control thread (requests) and the training loop (reaching the boundary, releasing);
every method takes the lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from andrea.protocol.status import HoldState, HoldStatus


@dataclass
class Hold:
    id: str
    owner_pid: int | None
    requested_step: int
    timeout_s: float
    requested_at: float
    state: HoldState = HoldState.PENDING
    step: int | None = None
    since: float | None = None
    #: Every loss and sample record up to `step` is durable at the proxy: a pivot may start.
    acknowledged: bool = False
    error: str | None = None

    def describe(self, now: float) -> HoldStatus:
        return HoldStatus(
            id=self.id,
            state=self.state,
            owner_pid=self.owner_pid,
            requested_at_step=self.requested_step,
            step=self.step,
            age_s=round(now - (self.since if self.since is not None else self.requested_at), 1),
            acknowledged=self.acknowledged,
            timeout_s=self.timeout_s,
            error=self.error,
        )


class Holds:
    """The trainer's current hold, if any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hold: Hold | None = None
        self._released = False
        #: The last hold released or cancelled, and how: a retried resume is answered the same.
        self._done: tuple[str, str] | None = None

    def request(
        self, hold_id: str, owner_pid: int | None, step: int, timeout_s: float
    ) -> str | None:
        """Register a hold asked for at `step`; an error message when another one is in the way."""
        with self._lock:
            h = self._hold
            if h is not None and h.id == hold_id:
                return None  # the same request again (a client's retry after a lost reply)
            if h is not None and h.state is not HoldState.FAILED:
                where = f"holding after step {h.step}" if h.step is not None else "pending"
                return (
                    f"another pivot holds this trainer (hold {h.id}, {where}, client pid "
                    f"{h.owner_pid or 'unknown'}); wait for it, or cancel it with `andreactl pivot --cancel`"
                )
            self._hold = Hold(hold_id, owner_pid, step, timeout_s, time.monotonic())
            self._released = False
            return None

    def due(self) -> Hold | None:
        """The pending hold to take at this boundary, if any."""
        with self._lock:
            h = self._hold
            return h if h is not None and h.state is HoldState.PENDING else None

    def begin(self, hold_id: str, step: int) -> bool:
        """The trainer checkpointed `step` for `hold_id` and holds now. False if the hold was
        cancelled meanwhile (the trainer then simply continues)."""
        with self._lock:
            h = self._hold
            if h is None or h.id != hold_id:
                return False
            h.state, h.step, h.since = HoldState.HOLDING, step, time.monotonic()
            return True

    def fail(self, hold_id: str, error: str) -> None:
        with self._lock:
            h = self._hold
            if h is not None and h.id == hold_id:
                h.state, h.error = HoldState.FAILED, error

    def mark_acknowledged(self) -> None:
        with self._lock:
            if self._hold is not None:
                self._hold.acknowledged = True

    def release(self, hold_id: str) -> tuple[str | None, str]:
        """Release (or cancel, while pending) `hold_id`: (error, what happened)."""
        with self._lock:
            h = self._hold
            if (
                self._done is not None
                and self._done[0] == hold_id
                and (h is None or h.id != hold_id)
            ):
                return None, self._done[1]
            if h is None or h.id != hold_id or h.state is HoldState.FAILED:
                current = "none" if h is None or h.state is HoldState.FAILED else h.id
                return f"no hold {hold_id} on this trainer (current hold: {current})", ""
            if h.state is HoldState.PENDING:
                self._hold = None
                self._done = (hold_id, "cancelled before the boundary")
            else:
                self._released = True
                self._done = (hold_id, f"released after step {h.step}")
            return None, self._done[1]

    def take_release(self, hold_id: str) -> bool:
        """True once `hold_id` was released (the hold is then gone)."""
        with self._lock:
            h = self._hold
            if h is None or h.id != hold_id:
                return True  # cancelled or replaced: nothing holds the trainer any more
            if self._released:
                self._hold, self._released = None, False
                return True
            return False

    def expired(self, hold_id: str) -> bool:
        with self._lock:
            h = self._hold
            return (
                h is not None
                and h.id == hold_id
                and h.since is not None
                and time.monotonic() - h.since > h.timeout_s
            )

    def drop(self, hold_id: str) -> None:
        with self._lock:
            if self._hold is not None and self._hold.id == hold_id:
                self._hold, self._released = None, False

    def describe(self) -> HoldStatus | None:
        with self._lock:
            return None if self._hold is None else self._hold.describe(time.monotonic())
