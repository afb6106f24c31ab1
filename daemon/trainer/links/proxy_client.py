"""The trainer's end of the trainer↔proxy link: assignments in, losses and samples out.

A background thread owns the DEALER socket, so the training loop never waits on the network in
steady state: it prefetches the arms of the next W steps (the proxy's lag) and ships each step's
loss record, which the link keeps until the proxy acknowledges it as durable. When the proxy is
silent the thread drops the socket, opens a fresh one and re-sends everything unacknowledged
(Lazy Pirate); a restarted proxy thus loses nothing, and every record is written at most once
because the proxy keys them by (segment, step).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections import OrderedDict

import zmq

from andrea.protocol import messages
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.transport import new_id

log = logging.getLogger(__name__)

#: Silence after which a request is considered lost and the socket is rebuilt.
REPLY_TIMEOUT = 2.0
POLL_MS = 20
MAX_BATCH = 256
#: How long a hello refused because another trainer life is alive is asked again (the previous
#: trainer may still be exiting when this one starts), once a second.
HELLO_PATIENCE = 60.0


class ProxyRefused(RuntimeError):
    """The proxy answered the trainer's hello with an error (e.g. another seed or arm set)."""


class ProxyLink:
    def __init__(self, ep: str, resume_step: int, seed: int, arms: list[str]) -> None:
        self.ep = ep
        self.resume_step = resume_step
        self.seed = seed
        self.arms = arms
        #: Who this life is, to the proxy: the process, and a secret only the proxy hears.
        self.pid = os.getpid()
        self.life = secrets.token_hex(16)
        self.segment: int | None = None
        self.welcome: messages.Welcome | None = None
        self.refused: str | None = None
        self._cv = threading.Condition()
        self._assigned: dict[int, messages.Assignment] = {}
        self._want = resume_step + 1
        self._losses: OrderedDict[tuple[int, int], LossEntry] = OrderedDict()
        self._samples: OrderedDict[str, messages.SampleReport] = OrderedDict()
        self._evals: OrderedDict[tuple[int, int], EvalEntry] = OrderedDict()
        self._sent_at: dict[tuple[int, int] | tuple[str, int, int] | str, float] = {}
        self._assign_pending: tuple[str, float] | None = None
        self._assign_after = 0.0
        self._hello_pending: tuple[str, float] | None = None
        self._hello_after = 0.0
        self._refused_since: float | None = None
        #: The proxy's phases as last heard (Welcome or Assignments), oldest first.
        self._phases: list[messages.PhaseStart] = []
        self._last_reply = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proxy-link", daemon=True)

    # ---- training-loop side -----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def connected(self) -> bool:
        return self.welcome is not None and time.monotonic() - self._last_reply < 3 * REPLY_TIMEOUT

    def assignment(self, step: int, timeout: float) -> messages.Assignment | None:
        """The arm of `step`, waiting up to `timeout` seconds. Also moves the prefetch window."""
        with self._cv:
            if self.refused:
                raise ProxyRefused(self.refused)
            self._want = step
            for s in [s for s in self._assigned if s < step]:
                del self._assigned[s]
            if step not in self._assigned:
                self._cv.wait(timeout)
            if self.refused:
                raise ProxyRefused(self.refused)
            return self._assigned.get(step)

    def restart_after(self, step: int, new_segment: bool = False) -> None:
        """Forget every prefetched arm and say hello again: after a pivot the proxy answers with
        the new phase, and the arms of steps after `step` must come from it. `new_segment`: the
        trainer rolled back to `step`, which starts a new life (its re-trained steps must not be
        taken for duplicates of the superseded ones, still unacknowledged records included)."""
        with self._cv:
            self._assigned.clear()
            self._want = step + 1
            self.welcome = None
            self._hello_pending = self._assign_pending = None
            if new_segment:
                self.segment = None
                self.resume_step = step

    def enter_phase(self, new: messages.NewPhase) -> None:
        """The proxy committed phase `new` and released this trainer's hold with it: the arms
        prefetched for the steps after its start were drawn under the old phase and are dropped,
        and a reply drawn before the pivot is not taken (`_heard_phases`). The link goes on as
        it was: no new hello."""
        with self._cv:
            known = [p for p in self._phases if p.phase < new.phase]
            start = messages.PhaseStart(phase=new.phase, after_step=new.after_step)
            self._heard_phases([*known, start])
            # A request already on its way is answered from the old phase: ask again.
            self._assign_pending = None
            self._want = new.after_step + 1
            self._cv.notify_all()

    def rollback_target(self, step: int, phase: int) -> tuple[int, int] | None:
        """(phase, its start) when the proxy has started a phase after `phase` whose first step
        this trainer has already trained under `phase` (a pivot while it ran ahead: the manual
        path, or a trainer resumed from a checkpoint of the old phase); None otherwise."""
        with self._cv:
            later = [p for p in self._phases if p.phase > phase]
            first = min(later, key=lambda p: p.phase, default=None)
            if first is not None and step > first.after_step:
                return first.phase, first.after_step
            return None

    def _heard_phases(self, phases: list[messages.PhaseStart]) -> bool:
        """Called with the lock held; False when `phases` predates a pivot already heard of (the
        reply was made before it). A new phase makes every prefetched arm after its start stale:
        they were drawn under the old policy."""
        if not phases or phases == self._phases:
            return True
        if self._phases and phases[-1].phase < self._phases[-1].phase:
            return False
        newest = phases[-1]
        if self._phases and newest.phase > self._phases[-1].phase:
            stale = [
                s
                for s, a in self._assigned.items()
                if s > newest.after_step and a.phase < newest.phase
            ]
            for s in stale:
                del self._assigned[s]
            if stale:
                log.info(
                    "proxy started phase %d after step %d: dropped %d prefetched arms of the old phase",
                    newest.phase,
                    newest.after_step,
                    len(stale),
                )
        self._phases = list(phases)
        return True

    def submit_loss(self, entry: LossEntry) -> None:
        with self._cv:
            self._losses[(entry.segment, entry.step)] = entry

    def submit_eval(self, entry: EvalEntry) -> None:
        """Hand over an evaluation record; kept (and re-sent) until the proxy acknowledges it."""
        with self._cv:
            self._evals[(entry.segment, entry.step)] = entry

    def unacknowledged_evals(self) -> list[EvalEntry]:
        with self._cv:
            return list(self._evals.values())

    def submit_samples(self, report: messages.SampleReport) -> None:
        with self._cv:
            self._samples[report.id] = report

    def unacknowledged(self) -> list[LossEntry]:
        with self._cv:
            return list(self._losses.values())

    def wait_acknowledged(self, timeout: float) -> bool:
        """Wait until every loss, evaluation and sample record is acknowledged; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while (self._losses or self._evals or self._samples) and (
                left := deadline - time.monotonic()
            ) > 0:
                self._cv.wait(left)
            return not (self._losses or self._evals or self._samples)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # ---- link thread ------------------------------------------------------------------------

    def _socket(self) -> zmq.Socket:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, messages.MAX_MESSAGE_BYTES)
        sock.connect(self.ep)
        return sock

    def _run(self) -> None:
        sock = self._socket()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                with self._cv:
                    since = self._outstanding_since()
                if since is not None and now - since > REPLY_TIMEOUT:
                    # Lazy Pirate: the proxy is gone or restarting. A fresh socket drops whatever
                    # the old one had queued; everything unacknowledged is sent again below.
                    sock.close(linger=0)
                    sock = self._socket()
                    with self._cv:
                        self._hello_pending = self._assign_pending = None
                        self._sent_at.clear()
                        self.welcome = None
                for msg in self._due(now):
                    sock.send_multipart([b"", messages.encode(msg)])
                if sock.poll(POLL_MS):
                    while sock.poll(0):
                        self._on_reply(messages.decode(sock.recv_multipart()[-1]))
        except Exception:
            log.exception("proxy link thread failed")
            with self._cv:
                self.refused = "the proxy link thread failed (see the log)"
                self._cv.notify_all()
        finally:
            sock.close(linger=0)

    def _outstanding_since(self) -> float | None:
        times = [t for _, t in filter(None, (self._hello_pending, self._assign_pending))]
        times += self._sent_at.values()
        return min(times) if times else None

    def _due(self, now: float) -> list[messages._Msg]:
        """Messages to send now: hello until welcomed, then assignment requests, losses, samples."""
        out: list[messages._Msg] = []
        with self._cv:
            if self.welcome is None:
                if self._hello_pending is None and now >= self._hello_after:
                    hello = messages.Hello(
                        id=new_id(),
                        segment=self.segment,
                        resume_step=self.resume_step,
                        seed=self.seed,
                        arms=self.arms,
                        pid=self.pid,
                        life=self.life,
                    )
                    self._hello_pending = (hello.id, now)
                    out.append(hello)
                return out
            if self._assign_pending is None and now >= self._assign_after:
                lag = self.welcome.lag
                first = next(
                    (s for s in range(self._want, self._want + lag) if s not in self._assigned),
                    None,
                )
                if first is not None:
                    req = messages.AssignRequest(
                        id=new_id(),
                        segment=self.welcome.segment,
                        from_step=first,
                        count=self._want + lag - first,
                    )
                    self._assign_pending = (req.id, now)
                    out.append(req)
            unsent = [e for k, e in self._losses.items() if k not in self._sent_at][:MAX_BATCH]
            if unsent:
                out.append(messages.LossReport(id=new_id(), entries=unsent))
                for e in unsent:
                    self._sent_at[(e.segment, e.step)] = now
            for key, entry in self._evals.items():
                if ("eval", *key) not in self._sent_at:
                    self._sent_at[("eval", *key)] = now
                    out.append(messages.EvalReport(id=new_id(), entry=entry))
            for sid, report in self._samples.items():
                if sid not in self._sent_at:
                    self._sent_at[sid] = now
                    out.append(report)
        return out

    def _on_reply(self, msg: messages.Message) -> None:
        with self._cv:
            self._last_reply = time.monotonic()
            if isinstance(msg, messages.Welcome):
                if self._hello_pending and msg.id == self._hello_pending[0]:
                    self._hello_pending = None
                    self._refused_since = None
                    self.welcome = msg
                    self._heard_phases(msg.phases)
                    if self.segment is None:
                        log.info(
                            "proxy connected: segment %d, phase %d, lag %d",
                            msg.segment,
                            msg.phase,
                            msg.lag,
                        )
                    else:
                        log.info(
                            "proxy reconnected (segment %d); re-sending %d unacknowledged records",
                            msg.segment,
                            len(self._losses),
                        )
                    self.segment = msg.segment
            elif isinstance(msg, messages.Assignments):
                if self._assign_pending and msg.id == self._assign_pending[0]:
                    self._assign_pending = None
                    if self._heard_phases(msg.phases):
                        for a in msg.items:
                            self._assigned[a.step] = a
                    if msg.waiting_for_step is not None:
                        # The proxy needs a loss it has not logged yet: ask again shortly, not in a spin.
                        self._assign_after = time.monotonic() + 0.05
            elif isinstance(msg, messages.LossAck):
                # Acks can free the loss an assignment was waiting for.
                self._assign_after = 0.0
                for key in msg.keys:
                    k = (key[0], key[1])
                    self._losses.pop(k, None)
                    self._sent_at.pop(k, None)
            elif isinstance(msg, messages.EvalAck):
                k = (msg.key[0], msg.key[1])
                self._evals.pop(k, None)
                self._sent_at.pop(("eval", *k), None)
            elif isinstance(msg, messages.Reply):
                if self._hello_pending and msg.id == self._hello_pending[0] and not msg.ok:
                    self._hello_refused(msg.error or "")
                elif not msg.ok and (msg.error or "").startswith(messages.UNKNOWN_PEER):
                    self._hello_again()
                elif msg.id in self._samples:
                    self._samples.pop(msg.id)
                    self._sent_at.pop(msg.id, None)
                elif not msg.ok:
                    log.warning("proxy error: %s", msg.error)
            self._cv.notify_all()

    def _hello_refused(self, error: str) -> None:
        """Called with the lock held. A refusal because another trainer life is alive is asked
        again for HELLO_PATIENCE seconds (it may be exiting); any other refusal is final."""
        now = time.monotonic()
        self._hello_pending = None
        if error.startswith(messages.TRAINER_ALIVE):
            self._refused_since = self._refused_since or now
            if now - self._refused_since < HELLO_PATIENCE:
                log.warning("the proxy refused this trainer for now (%s); asking again", error)
                self._hello_after = now + 1.0
                return
        self.refused = f"the proxy refused this trainer: {error}"

    def _hello_again(self) -> None:
        """Called with the lock held: the proxy does not know this socket (it restarted while the
        socket reconnected by itself). Say hello again; everything unacknowledged follows."""
        if self.welcome is None:
            return  # a hello is on its way already
        log.info("the proxy does not know this link (a restarted proxy?): saying hello again")
        self.welcome = None
        self._hello_pending = self._assign_pending = None
        self._sent_at.clear()
