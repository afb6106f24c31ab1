"""andrea-proxy: owns the data-mixing bandit and the run's audit trail.

It serves one ROUTER socket (the trainer's link and andreactl's control requests), and owns four
files in the run directory:
- `.loss.json`: every trained step, appended and fsync'd before the trainer is told (acknowledged);
- `.eval.json`: every held-out evaluation, with the same guarantees;
- `.samples.json`: the most recent generated samples, with the arm mix that led to them;
- `.state.json`: the bandit (a snapshot old enough to restart from, see `assignbook`), the policy,
  phase counters, zombie arms and the live probabilities — rewritten atomically every
  `STATE_EVERY` logged steps and on exit.

A restart of the proxy never stops, rewinds or confuses the trainer: the trainer holds its loss
records until they are acknowledged and re-sends them, and every assignment is recomputed
identically (see `assignbook`).

The rooms: this module is the process (lock, socket, the duty-cycled loop, routing, exit codes);
`run_state` the state and its writes; `startup` how it is rebuilt from the run directory;
`trainer_messages` the trainer's messages; `peers` which trainer life speaks; `phase_commit` a
pivot's checks and commit; `pivot_orchestrator` the pivot `andreactl pivot` asks for, from the
trainer's hold to its release; `proxyfiles` and `archive` the file formats.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque

import zmq

from andrea.daemon.mixing.phase_commit import PhaseCommit
from andrea.daemon.mixing.pivot_orchestrator import PivotOrchestrator
from andrea.daemon.mixing.run_state import ProxyOptions, ProxyRunState
from andrea.daemon.mixing.startup import LogContradiction, configured_arms
from andrea.daemon.mixing.trainer_messages import TrainerLink
from andrea.daemon.rundir.layout import bind_endpoint, claim
from andrea.daemon.runtime.dutycycle import Burst
from andrea.daemon.runtime.exitcodes import ExitCode, disk_full
from andrea.daemon.runtime.logthrottle import ThrottledWarning
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.runtime.peer_frames import Rejected, decode_or_reject
from andrea.daemon.runtime.sdnotify import Notifier
from andrea.protocol import messages
from andrea.protocol.transport import bind_router, close_router

# Importers (andrea-proxy's command line, the tests) find the proxy's public face here.
__all__ = ["LogContradiction", "Proxy", "ProxyOptions", "configured_arms"]

log = logging.getLogger(__name__)

#: The trainer's link: handled as soon as they arrive. Everything else (status, pivot) is served in
#: bursts at a bounded duty cycle (daemon/runtime/dutycycle.py), with up to MAX_DEFERRED_CONTROL requests
#: queued (clients retry what is dropped beyond that).
LINK_MESSAGES = (messages.Hello, messages.AssignRequest, messages.LossReport, messages.SampleReport)
MAX_DEFERRED_CONTROL = 1000


class Proxy(ProxyRunState):
    """The run state served on the run's proxy socket, holding the run directory's proxy lock."""

    def __init__(
        self, opts: ProxyOptions, flags: OperatorRequests, notifier: Notifier | None = None
    ) -> None:
        super().__init__(opts)
        self.flags = flags
        self.notifier = notifier or Notifier()
        self.rejections = ThrottledWarning(log)
        self.exit_code = ExitCode.OK
        self.link = TrainerLink(self, self.rejections)
        self.commits = PhaseCommit(self)
        self.pivots = PivotOrchestrator(self, self.commits, self._send)

    def setup(self) -> None:
        """Claim the run directory, rebuild the state, complete a manual pivot, bind the socket."""
        self._lock = claim(self.run_dir, "proxy")
        logged = self.start()
        if self.policy_changed:
            self.commits.manual()
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.endpoint = bind_endpoint(self.run_dir, "proxy")
        self.sock = bind_router(self.ctx, self.endpoint)
        self.write_state()
        log.info("proxy ready: %d logged entries, up to step %d", logged, self.durable_step)

    # ---- requests ---------------------------------------------------------------------------

    def handle(self, peer: bytes, msg: messages.Message) -> messages.Message | None:
        if isinstance(msg, messages.Hello):
            return self.link.hello(peer, msg)
        if isinstance(msg, messages.AssignRequest):
            return self.link.assign(msg)
        if isinstance(msg, messages.LossReport):
            return self.link.losses(peer, msg)
        if isinstance(msg, messages.EvalReport):
            return self.link.eval(peer, msg)
        if isinstance(msg, messages.SampleReport):
            return self.link.samples(peer, msg)
        if isinstance(msg, messages.StatusRequest):
            return messages.Reply(
                id=msg.id, ok=True, data=json.loads(self.status().model_dump_json())
            )
        if isinstance(msg, messages.PivotRequest):
            return self.pivots.request(peer, msg)
        if isinstance(
            msg,
            (
                messages.CheckpointRequest,
                messages.StopRequest,
                messages.ResumeRequest,
                messages.HoldRequest,
            ),
        ):
            return messages.Reply(
                id=msg.id,
                ok=False,
                error=f"'{msg.type}' is a trainer command; send it to the trainer",
            )
        return messages.Reply(id=msg.id, ok=False, error=f"unexpected message type {msg.type!r}")

    # ---- loop -------------------------------------------------------------------------------

    def serve(self) -> None:
        """Answer requests until a stop is requested. The trainer's link messages are handled as
        they arrive; control requests (status, pivot) at a bounded duty cycle, queued meanwhile,
        so that clients polling status cannot take the CPU the trainer and its link need."""
        self.notifier.ready(f"serving, logged up to step {self.durable_step}")
        deferred: deque[tuple[bytes, messages.Message]] = deque(maxlen=MAX_DEFERRED_CONTROL)
        not_before = 0.0
        while not self.flags.stop_requested():
            self.notifier.tick()
            if (ignored := self.flags.take_ignored_signal()) is not None:
                log.info("%s received and ignored (see docs/operations.md)", ignored)
            if deferred and time.monotonic() >= not_before:
                burst = Burst()
                while deferred and not burst.spent():
                    peer, queued = deferred.popleft()
                    if not self._answer(peer, queued):
                        return
                not_before = time.monotonic() + burst.pause()
            wait = 100 if not deferred else max(0, int((not_before - time.monotonic()) * 1000))
            ready = self._wait(min(100, wait))
            if ready is None:
                return
            if not ready:
                continue
            frames = self.sock.recv_multipart()
            peer, payload = frames[0], frames[-1]
            msg = decode_or_reject(payload, self.rejections, whole_error=True)
            if isinstance(msg, Rejected):
                self.sock.send_multipart([peer, b"", messages.encode(msg.reply)])
                continue
            if not isinstance(msg, LINK_MESSAGES):
                deferred.append((peer, msg))
            elif not self._answer(peer, msg):
                return
        log.info("stop requested (%s)", self.flags.stop_reason)

    def _wait(self, ms: int) -> bool | None:
        """Wait up to `ms` for a request, serving the pivot in progress meanwhile: True when a
        request is there, None when the proxy must stop (a pivot's write failed)."""
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        for sock in self.pivots.sockets():
            poller.register(sock, zmq.POLLIN)
        ready = dict(poller.poll(ms))
        try:
            self.pivots.poll()
            self.pivots.tick()
        except OSError as e:
            self._write_failed(e)
            return None
        return self.sock in ready

    def _send(self, peer: bytes, reply: messages.Message) -> None:
        self.sock.send_multipart([peer, b"", messages.encode(reply)])

    def _answer(self, peer: bytes, msg: messages.Message) -> bool:
        """Handle one request and send its reply; False when the proxy must stop (a write failed)."""
        try:
            reply = self.handle(peer, msg)
        except OSError as e:
            self._write_failed(e)
            return False
        if reply is not None:
            self._send(peer, reply)
        return True

    def _write_failed(self, e: OSError) -> None:
        """A file could not be written. The request was not acknowledged, so the trainer keeps
        its records; a restart repairs (.loss.json's tail, a pivot half done) and goes on. A full
        disk is told apart: restarting before space is freed cannot help."""
        full = disk_full(e)
        self.exit_code = ExitCode.CHECKPOINT_FAILED if full else ExitCode.FAILURE
        log.error(
            "cannot write the run's files (%s); stopping with exit code %d%s; nothing"
            " acknowledged is lost",
            e,
            self.exit_code,
            ": free space, then restart the proxy" if full else "",
        )

    def close(self) -> None:
        self.pivots.abandon("the proxy stopped")
        self.pivots.close()
        self.close_files()
        close_router(self.sock, self.endpoint)
        self._lock.close()  # the run directory is free for the next proxy
        log.info("proxy stopped; state written at durable step %d", self.durable_step)
