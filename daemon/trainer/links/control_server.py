"""The trainer's control socket: status, checkpoint and stop as ZeroMQ requests (andreactl, units).

A thread owns the ROUTER socket so that status answers while a long step runs. Requests only set
the same flags the signals set; the training loop acts on them at the next step boundary. A request
with `wait` gets its reply once the work is durable (checkpoint) or done (stop), which is what makes
`systemctl reload` synchronous — a bare `kill -USR1` returns before anything happened.

Control traffic must never cost training more than a few percent: the thread serves requests in
bursts at a bounded duty cycle (daemon/runtime/dutycycle.py). `checkpoint`/`stop` set their flags as soon as
they are read.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from andrea.daemon.runtime.dutycycle import Burst
from andrea.daemon.runtime.logthrottle import ThrottledWarning
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.runtime.peer_frames import Rejected, decode_or_reject
from andrea.daemon.trainer.links.hold_registry import HoldRegistry
from andrea.protocol import messages
from andrea.protocol.status import TrainerStatus
from andrea.protocol.transport import bind_router, close_router

log = logging.getLogger(__name__)

#: How old a status reply may be (a poller sees the step a tenth of a second late at most).
STATUS_TTL = 0.1


class ControlServer:
    def __init__(
        self,
        ep: str,
        flags: OperatorRequests,
        status: Callable[[], TrainerStatus],
        holds: HoldRegistry | None = None,
    ) -> None:
        self.flags = flags
        self.status = status
        self.holds = holds or HoldRegistry()
        self._ep = ep
        self._sock = bind_router(zmq.Context.instance(), ep)
        self._outbox: queue.Queue[tuple[bytes, messages.Reply]] = queue.Queue()
        self._lock = threading.Lock()
        self._checkpoint_waiters: list[tuple[bytes, str]] = []
        self._stop_waiters: list[tuple[bytes, str]] = []
        #: The hold requests waiting for the trainer to hold (or not): hold id → (peer, id)s.
        self._hold_waiters: dict[str, list[tuple[bytes, str]]] = {}
        self.holds.on_settled(self._hold_settled)
        self._done = threading.Event()
        self._rejections = ThrottledWarning(log)
        self._status_cache: tuple[float, dict[str, Any]] | None = None
        self._thread = threading.Thread(target=self._run, name="control", daemon=True)
        self._thread.start()

    # ---- training-loop side -----------------------------------------------------------------

    def serve_status(self, status: Callable[[], TrainerStatus]) -> None:
        """Answer status from `status` from now on: the built trainer's, which knows more than
        the start-up's (the socket is bound before the data is prepared)."""
        self.status = status

    def checkpoint_served(self, data: dict[str, Any], error: str | None = None) -> None:
        """A requested checkpoint is durable (or could not be written): answer those waiting."""
        with self._lock:
            waiters, self._checkpoint_waiters = self._checkpoint_waiters, []
        for peer, rid in waiters:
            self._outbox.put(
                (peer, messages.Reply(id=rid, ok=error is None, error=error, data=data))
            )

    def close(self, final: dict[str, Any], error: str | None = None) -> None:
        """Answer `stop --wait` (and any checkpoint still waiting) with the final result, then
        stop. `error`: why the exit code is not 0 (the clients print it)."""
        ok = final.get("exit_code", 0) == 0
        self.holds.abandon("the trainer stopped before it held")
        with self._lock:
            waiters = self._stop_waiters + self._checkpoint_waiters
            self._stop_waiters, self._checkpoint_waiters = [], []
        for peer, rid in waiters:
            reply = messages.Reply(id=rid, ok=ok, error=None if ok else error, data=final)
            self._outbox.put((peer, reply))
        self._done.set()
        self._thread.join(timeout=5)

    def abandon(self, exit_code: int | None, why: str) -> None:
        """The trainer ends without its final result (a stop during start-up, an error): a
        `stop --wait` hears the exit code (None: a failure, its code decided elsewhere) and
        `why`, a `checkpoint --wait` that no checkpoint comes; then stop. Nothing once closed."""
        if self._done.is_set():
            return
        self.holds.abandon(f"the trainer stopped before it held: {why}")
        with self._lock:
            stops, checkpoints = self._stop_waiters, self._checkpoint_waiters
            self._stop_waiters, self._checkpoint_waiters = [], []
        data = {"step": 0, "exit_code": exit_code, "checkpoint": None, "ended": why}
        for peer, rid in stops:
            ok = exit_code == 0
            reply = messages.Reply(id=rid, ok=ok, error=None if ok else why, data=data)
            self._outbox.put((peer, reply))
        for peer, rid in checkpoints:
            error = f"no checkpoint: {why}"
            self._outbox.put((peer, messages.Reply(id=rid, ok=False, error=error, data=data)))
        self._done.set()
        self._thread.join(timeout=5)

    def _hold_settled(self, hold_id: str, step: int | None, error: str | None) -> None:
        """The hold request `hold_id` has its answer: the trainer holds after `step`, or `error`."""
        with self._lock:
            waiters = self._hold_waiters.pop(hold_id, [])
        data = {"hold_id": hold_id, "step": step}
        for peer, rid in waiters:
            self._outbox.put(
                (peer, messages.Reply(id=rid, ok=error is None, error=error, data=data))
            )

    # ---- socket thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not (self._done.is_set() and self._outbox.empty()):
                while not self._outbox.empty():
                    peer, reply = self._outbox.get_nowait()
                    self._sock.send_multipart([peer, b"", messages.encode(reply)])
                if self._done.is_set() or not self._sock.poll(100):
                    continue
                burst = Burst()
                while not burst.spent():
                    try:
                        frames = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    answer = self._handle(frames[0], frames[-1])
                    if answer is not None:
                        self._sock.send_multipart([frames[0], b"", messages.encode(answer)])
                # Sleeping hands the interpreter lock to the training loop.
                self._done.wait(burst.pause())
        except Exception:
            log.exception("control socket thread failed; signals still work")
        finally:
            close_router(self._sock, self._ep)

    def _status_data(self) -> dict[str, Any]:
        """The status, rebuilt at most every STATUS_TTL seconds: under a flood of polls most
        replies reuse it, which makes each one cheaper (more of them fit in the duty cycle)."""
        now = time.monotonic()
        if self._status_cache is None or now - self._status_cache[0] > STATUS_TTL:
            # JSON text first: a non-finite held-out loss becomes the string .eval.json uses.
            self._status_cache = (now, json.loads(self.status().model_dump_json()))
        return self._status_cache[1]

    def _handle(self, peer: bytes, payload: bytes) -> messages.Reply | None:
        msg = decode_or_reject(payload, self._rejections, "control message")
        if isinstance(msg, Rejected):
            return msg.reply
        if isinstance(msg, messages.StatusRequest):
            return messages.Reply(id=msg.id, ok=True, data=self._status_data())
        if isinstance(msg, messages.HoldRequest):
            return self._hold(peer, msg)
        if isinstance(msg, messages.CheckpointRequest):
            # A waiter is registered before its flag is set: once set, the training loop may
            # serve it (or finish) at once, and answers only the waiters it finds.
            log.info("control: checkpoint requested%s", " (the client waits)" if msg.wait else "")
            if msg.wait:
                with self._lock:
                    self._checkpoint_waiters.append((peer, msg.id))
            if msg.boundary:
                self.flags.request_boundary_checkpoint()
            else:
                self.flags.request_checkpoint("control")
            if msg.wait:
                return None
            return messages.Reply(
                id=msg.id, ok=True, data={"accepted": "boundary" if msg.boundary else "next step"}
            )
        if isinstance(msg, messages.ResumeRequest):
            error, done = self.holds.release(msg.hold_id, msg.new_phase)
            if error is not None:
                return messages.Reply(id=msg.id, ok=False, error=error)
            if done.startswith("cancelled"):
                self.flags.cancel_hold()
            else:
                self.flags.request_resume()
            return messages.Reply(
                id=msg.id, ok=True, data={"hold_id": msg.hold_id, "outcome": done}
            )
        if isinstance(msg, messages.StopRequest):
            log.info("control: stop requested%s", " (the client waits)" if msg.wait else "")
            if msg.wait:
                with self._lock:
                    self._stop_waiters.append((peer, msg.id))
            self.flags.request_stop("control")
            if msg.wait:
                return None
            return messages.Reply(id=msg.id, ok=True, data={"accepted": "stop"})
        return messages.Reply(
            id=msg.id, ok=False, error=f"the trainer does not serve {msg.type!r} requests"
        )

    def _hold(self, peer: bytes, msg: messages.HoldRequest) -> messages.Reply | None:
        """A pivot's hold, identified by the request's id: answered once the trainer holds with
        every record acknowledged, or cannot (HoldRegistry's `settled`)."""
        # The waiter first: once the hold is registered the loop may settle it at once.
        with self._lock:
            self._hold_waiters.setdefault(msg.id, []).append((peer, msg.id))
        error = self.holds.request(msg.id, msg.owner_pid, self.status().step, msg.timeout_s)
        if error is not None:
            with self._lock:
                self._hold_waiters.pop(msg.id, None)
            return messages.Reply(id=msg.id, ok=False, error=error)
        held = self.holds.describe()
        if held is not None and held.id == msg.id and held.acknowledged:
            # A retried request for a hold that was answered already.
            self._hold_settled(msg.id, held.step, None)
            return None
        log.info("control: hold %s requested by pid %s", msg.id, msg.owner_pid or "unknown")
        self.flags.request_boundary_checkpoint(hold=True)
        return None
