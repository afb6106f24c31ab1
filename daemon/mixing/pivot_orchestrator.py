"""`andreactl pivot` run by the proxy: one request in, one answer out, the whole pivot between.

The proxy owns the bandit, so it runs the pivot itself, on the trainer's control socket:

1. *accepted*: the request's policy passes every check that does not need the boundary
   (`PhaseCommit.check`); a refusal is answered at once and changes nothing;
2. *hold*: the proxy asks the trainer to checkpoint at its next cadence boundary and hold
   (`hold`); the trainer answers once it holds there with every record acknowledged;
3. *commit*: the proxy asks again whether the trainer still holds (a cancel may have released
   it), then starts the new phase after that boundary (`PhaseCommit.commit`);
4. *release*: the proxy releases the trainer with the new phase (`resume` carrying `new_phase`):
   the trainer takes its next arms from the new phase without asking again;
5. *answer*: the client hears the outcome.

The client only waits. Killed at any moment, it leaves nothing behind: the proxy carries the pivot
through without it (the answer goes nowhere). Every hold the proxy starts ends: the proxy gives
the pivot up (cancelling the hold) when the trainer does not hold within the request's
`timeout_s`, when the trainer exits, and when the proxy itself stops; and a trainer whose proxy
died while it held releases itself after `hold_timeout_s`. A pivot given up before its commit
changes nothing; after it, the new phase stands and the trainer hears of it when it asks the
proxy again.

`ANDREA_PIVOT_PAUSE` (tests only: `STAGE=SECONDS[,...]`, stages `accepted`, `holding`, `committed`,
`released`) makes the proxy wait that long before it goes on from a stage, serving the trainer's
link meanwhile, so that a test can kill the client at a known moment; unset, nothing waits.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from andrea.daemon.mixing.phase_commit import PhaseCommit
from andrea.daemon.mixing.run_state import ProxyRunState
from andrea.daemon.rundir.layout import lock_holder, peer_endpoint
from andrea.protocol import messages
from andrea.protocol.transport import new_id

log = logging.getLogger(__name__)

#: The test-only pauses: `STAGE=SECONDS[,STAGE=SECONDS...]`.
PAUSE_ENV = "ANDREA_PIVOT_PAUSE"
STAGES = ("accepted", "holding", "committed", "released")
#: How often the trainer's lock is looked at while the proxy waits for its hold.
ALIVE_EVERY_S = 1.0
#: How long the trainer has to answer a release before the proxy answers its client anyway.
RELEASE_TIMEOUT_S = 30.0

#: Sends the answer of a request to the peer that asked it.
Answer = Callable[[bytes, messages.Reply], None]


def pauses(text: str | None) -> dict[str, float]:
    """The test-only pauses of `ANDREA_PIVOT_PAUSE`; a malformed entry is ignored, with a warning
    naming it."""
    out: dict[str, float] = {}
    for item in filter(None, (text or "").split(",")):
        stage, _, seconds = item.partition("=")
        try:
            if stage not in STAGES:
                raise ValueError(f"unknown stage {stage!r} (one of {', '.join(STAGES)})")
            out[stage] = float(seconds or "1")
        except ValueError as e:
            log.warning("%s: %s ignored: %s", PAUSE_ENV, item, e)
    return out


@dataclass
class _Pivot:
    """A pivot in progress: whose, which hold, where it is."""

    peer: bytes
    request: messages.PivotRequest
    hold_id: str
    deadline: float
    boundary: int | None = None
    confirming: bool = False
    committed: messages.Reply | None = None
    release_id: str | None = None
    released_by: float | None = None


class PivotOrchestrator:
    """The one pivot the proxy runs at a time, driven by the proxy's loop: `request` takes a
    pivot request, `poll` the trainer's answers, `tick` the timeouts and pauses."""

    def __init__(self, run_state: ProxyRunState, commits: PhaseCommit, answer: Answer) -> None:
        self.run_state = run_state
        self.commits = commits
        self.answer = answer
        self.pauses = pauses(os.environ.get(PAUSE_ENV))
        self.current: _Pivot | None = None
        self.sock: zmq.Socket[bytes] | None = None
        self._next: tuple[float, Callable[[], None]] | None = None
        self._alive_at = 0.0

    # ---- from the proxy's loop ---------------------------------------------------------------

    def request(self, peer: bytes, msg: messages.PivotRequest) -> messages.Reply | None:
        """A pivot request: the refusal or a dry run's answer now, or None (the answer comes once
        the pivot is done or given up)."""
        if msg.dry_run:
            answer = self.commits.check(msg)
            assert answer is not None  # a dry run is always answered
            return answer
        if msg.boundary_step is not None:
            return messages.Reply(
                id=msg.id,
                ok=False,
                error="a pivot's boundary is the trainer's next checkpoint boundary, where the "
                "proxy holds it: only a dry run names one",
            )
        if self.current is not None:
            return messages.Reply(
                id=msg.id,
                ok=False,
                error=f"another pivot is in progress (hold {self.current.hold_id}); wait for it, "
                "or cancel it with `andreactl pivot --cancel`",
            )
        if lock_holder(self.run_state.run_dir, "trainer") is None:
            return messages.Reply(
                id=msg.id, ok=False, error="a pivot needs the trainer running and answering"
            )
        refusal = self.commits.check(msg)
        if refusal is not None:
            return refusal
        pivot = _Pivot(peer, msg, new_id(), time.monotonic() + msg.timeout_s)
        self.current = pivot
        log.info(
            "pivot: accepted (hold %s); holding the trainer at its next boundary", pivot.hold_id
        )
        self._then("accepted", self._ask_hold)
        return None

    def sockets(self) -> list[zmq.Socket[bytes]]:
        """The sockets the proxy's loop polls for this: the trainer's control socket, if open."""
        return [self.sock] if self.sock is not None else []

    def poll(self) -> None:
        """Read what the trainer answered."""
        while self.sock is not None and self.sock.poll(0):
            frame = self.sock.recv_multipart()[-1]
            try:
                reply = messages.decode(frame)
            except ValueError:  # pydantic's ValidationError is one
                log.warning("pivot: the trainer's control socket sent an invalid reply")
                continue
            if isinstance(reply, messages.Reply):
                self._on_reply(reply)

    def tick(self) -> None:
        """Go on after a pause; give up a pivot whose trainer exited or never held in time."""
        now = time.monotonic()
        if self._next is not None and now >= self._next[0]:
            action, self._next = self._next[1], None
            action()
        p = self.current
        if p is None or self._next is not None:
            return
        if p.release_id is not None:
            if p.released_by is not None and now > p.released_by:
                log.warning("pivot: the trainer did not answer the release of hold %s", p.hold_id)
                self._finish(p.committed)
            return
        if now >= self._alive_at:
            self._alive_at = now + ALIVE_EVERY_S
            if lock_holder(self.run_state.run_dir, "trainer") is None:
                self._give_up("the trainer exited before it held; nothing was changed")
                return
        if p.boundary is None and now > p.deadline:
            self._give_up("the trainer did not reach a boundary; nothing was changed")

    def abandon(self, why: str) -> None:
        """The proxy stops: no hold it asked for outlives it (a committed phase stands)."""
        p = self.current
        if p is None:
            return
        if p.release_id is None:
            self._send_release(p, self._new_phase(p))
        self._finish(p.committed or self._failed(f"{why}; the pivot was given up"))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=1000)  # a release just sent still goes out
            self.sock = None

    # ---- the stages --------------------------------------------------------------------------

    def _then(self, stage: str, action: Callable[[], None]) -> None:
        """Go on with `action` after `stage`: at once, or after the stage's test-only pause."""
        pause = self.pauses.get(stage)
        if pause is None:
            action()
            return
        log.info("pivot: pausing %.1f s after stage %s (%s)", pause, stage, PAUSE_ENV)
        self._next = (time.monotonic() + pause, action)

    def _ask_hold(self) -> None:
        p = self.current
        assert p is not None
        if self.sock is None:
            self.sock = zmq.Context.instance().socket(zmq.DEALER)
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.setsockopt(zmq.MAXMSGSIZE, messages.MAX_MESSAGE_BYTES)
            self.sock.connect(peer_endpoint(self.run_state.run_dir, "trainer"))
        self._send_hold(p)
        log.info("pivot: asked the trainer to hold at its next boundary (hold %s)", p.hold_id)

    def _send_hold(self, p: _Pivot) -> None:
        assert self.sock is not None
        hold = messages.HoldRequest(
            id=p.hold_id, owner_pid=os.getpid(), timeout_s=p.request.hold_timeout_s
        )
        self.sock.send_multipart([b"", messages.encode(hold)])

    def _on_reply(self, reply: messages.Reply) -> None:
        p = self.current
        if p is None:
            return
        if reply.id == p.hold_id and p.boundary is None:
            if not reply.ok:
                self._finish(self._failed(f"{reply.error}; nothing was changed"))
                return
            p.boundary = int(reply.data["step"])
            log.info("pivot: the trainer holds after step %d (hold %s)", p.boundary, p.hold_id)
            self._then("holding", self._confirm)
        elif reply.id == p.hold_id and p.confirming:
            p.confirming = False
            if not reply.ok:
                self._finish(self._failed(f"{reply.error}; nothing was changed"))
                return
            self._commit()
        elif reply.id == p.release_id:
            if not reply.ok:
                log.warning("pivot: the trainer refused the release: %s", reply.error)
            self._then("released", lambda: self._finish(p.committed))

    def _confirm(self) -> None:
        """Ask again for the hold (its own id, answered at once while it holds): a cancel that
        released the trainer meanwhile makes the pivot nothing."""
        p = self.current
        assert p is not None
        p.confirming = True
        self._send_hold(p)

    def _commit(self) -> None:
        p = self.current
        assert p is not None and p.boundary is not None
        result = self.commits.commit(p.request, p.boundary)
        if not result.ok:
            # Nothing changed: the trainer goes on in the current phase.
            self._send_release(p, None)
            p.committed = self._failed(
                f"the proxy did not pivot ({result.error}); the trainer continues under the "
                "current policy"
            )
            return
        p.committed = result
        self._then("committed", lambda: self._send_release(p, self._new_phase(p)))

    def _new_phase(self, p: _Pivot) -> messages.NewPhase | None:
        if p.committed is None or not p.committed.ok:
            return None
        bandit = self.run_state.book.bandit
        return messages.NewPhase(
            phase=bandit.phase,
            after_step=bandit.phase_start_step,
            policy=bandit.policy.fingerprint(),
        )

    def _send_release(self, p: _Pivot, new_phase: messages.NewPhase | None) -> None:
        if self.sock is None:
            return
        release = messages.ResumeRequest(id=new_id(), hold_id=p.hold_id, new_phase=new_phase)
        p.release_id, p.released_by = release.id, time.monotonic() + RELEASE_TIMEOUT_S
        self.sock.send_multipart([b"", messages.encode(release)])
        log.info(
            "pivot: released the trainer (hold %s)%s",
            p.hold_id,
            f" into phase {new_phase.phase}" if new_phase is not None else "",
        )

    def _give_up(self, why: str) -> None:
        p = self.current
        assert p is not None
        log.warning("pivot: giving up hold %s: %s", p.hold_id, why)
        self._send_release(p, None)  # a pending hold is cancelled, a held one released
        self._finish(self._failed(why))

    def _failed(self, error: str) -> messages.Reply:
        p = self.current
        assert p is not None
        return messages.Reply(id=p.request.id, ok=False, error=error)

    def _finish(self, reply: messages.Reply | None) -> None:
        p, self.current, self._next = self.current, None, None
        if p is None:
            return
        if reply is None:
            reply = messages.Reply(id=p.request.id, ok=False, error="the pivot ended unanswered")
        if reply.ok:
            log.info("pivot: done (hold %s)", p.hold_id)
        self.answer(p.peer, reply)
