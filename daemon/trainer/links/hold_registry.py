"""The trainer's pivot hold: one identified hold at a time, released only by its own identity.

A pivot (run by the proxy) asks the trainer to checkpoint at its next cadence boundary and wait
there while the proxy starts a new phase. So that no hold can be taken for another, or outlive
the pivot that asked for it, a hold carries the id of the request that asked for it (its
identity), the step it was asked at (the boundary is always after it), the requester's pid, and
a timeout; a resume must name it, a second hold request is refused while one is pending or
active, and status shows its state and age. The hold request is answered once the trainer holds
with every record acknowledged, or as soon as it cannot (failed, cancelled, timed out, stopped):
`HoldRegistry` tells its `settled` callback (the control socket's) exactly once per hold.

Shared by the control thread (requests) and the training loop (reaching the boundary, releasing);
every method takes the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from andrea.protocol.messages import NewPhase
from andrea.protocol.status import HoldState, HoldStatus

#: Called once per hold: (hold id, the boundary step once holding, or None with the error).
Settled = Callable[[str, int | None, str | None], None]


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
    #: The phase the resume that released it carried (the proxy's committed pivot).
    new_phase: NewPhase | None = None

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


def gone(hold_id: str, how: str) -> str:
    """The answer of a hold request whose hold ended before the pivot could use it."""
    return f"hold {hold_id} is gone (cancelled or timed out): {how}"


def _ignore(hold_id: str, step: int | None, error: str | None) -> None:
    """No one waits for a hold's answer (a registry without a control socket)."""


class HoldRegistry:
    """The trainer's current hold, if any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hold: Hold | None = None
        self._released = False
        #: The last hold released or cancelled, and how: a retried resume is answered the same.
        self._done: tuple[str, str] | None = None
        #: The holds whose request was answered already (each is answered once).
        self._answered: set[str] = set()
        self._settled: Settled = _ignore

    def on_settled(self, settled: Settled) -> None:
        """Tell `settled` when a hold request has its answer (the control socket replies)."""
        self._settled = settled

    def _settle(self, hold_id: str, step: int | None, error: str | None) -> None:
        """Called with the lock held."""
        if hold_id not in self._answered:
            self._answered = {hold_id}  # only the current hold can be answered again
            self._settled(hold_id, step, error)

    def request(
        self, hold_id: str, owner_pid: int | None, step: int, timeout_s: float
    ) -> str | None:
        """Register a hold asked for at `step`; an error message when another one is in the way."""
        with self._lock:
            h = self._hold
            if h is not None and h.id == hold_id and not self._released:
                return None  # the same request again (a retry, or the proxy's confirmation)
            if self._done is not None and self._done[0] == hold_id:
                return gone(hold_id, self._done[1])
            if h is not None and h.state is not HoldState.FAILED:
                where = f"holding after step {h.step}" if h.step is not None else "pending"
                return (
                    f"another pivot holds this trainer (hold {h.id}, {where}, requested by pid "
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
                self._settle(hold_id, None, error)

    def mark_acknowledged(self) -> None:
        """Every record up to the boundary is durable at the proxy: the hold request's answer."""
        with self._lock:
            h = self._hold
            if h is not None and h.state is HoldState.HOLDING:
                h.acknowledged = True
                self._settle(h.id, h.step, None)

    def release(self, hold_id: str, new_phase: NewPhase | None = None) -> tuple[str | None, str]:
        """Release (or cancel, while pending) `hold_id`, with the phase the proxy committed if
        any: (error, what happened)."""
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
                self._settle(hold_id, None, gone(hold_id, self._done[1]))
            else:
                self._released = True
                h.new_phase = h.new_phase or new_phase
                self._done = (hold_id, f"released after step {h.step}")
                self._settle(hold_id, None, gone(hold_id, "released before it was acknowledged"))
            return None, self._done[1]

    def take_release(self, hold_id: str) -> NewPhase | None:
        """Once `hold_id` was released: the new phase its release carried, if any (the hold is
        then gone)."""
        with self._lock:
            h = self._hold
            if h is None or h.id != hold_id or not self._released:
                return None  # cancelled, replaced, or dropped: nothing carried a phase
            self._hold, self._released = None, False
            return h.new_phase

    def expired(self, hold_id: str) -> bool:
        with self._lock:
            h = self._hold
            return (
                h is not None
                and h.id == hold_id
                and h.since is not None
                and time.monotonic() - h.since > h.timeout_s
            )

    def drop(self, hold_id: str, why: str) -> None:
        """Forget `hold_id` (it timed out, or the trainer stops): its request hears `why`."""
        with self._lock:
            if self._hold is not None and self._hold.id == hold_id:
                self._settle(hold_id, None, why)
                self._hold, self._released = None, False

    def abandon(self, why: str) -> None:
        """The trainer stops: a hold request still waiting hears `why`."""
        with self._lock:
            if self._hold is not None:
                self._settle(self._hold.id, None, why)

    def describe(self) -> HoldStatus | None:
        with self._lock:
            return None if self._hold is None else self._hold.describe(time.monotonic())
