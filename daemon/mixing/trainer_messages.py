"""The trainer's side of the proxy: `hello`, `assign`, `losses`, `eval` and `samples`.

Every field is checked against the proxy's own state before anything is written, and a refused
message changes nothing (docs/protocol.md, "What a peer may send"). Records are taken only from a
peer that said a `hello` admitted as the live trainer life (`peers.TrainerPeers`). The records
themselves are written by the run state (`run_state.ProxyRunState`), durable before they are
acknowledged.
"""

from __future__ import annotations

import logging

from andrea.daemon.mixing.run_state import ProxyRunState
from andrea.daemon.runtime.logthrottle import ThrottledWarning
from andrea.protocol import messages
from andrea.protocol.lossentry import LossEntry

log = logging.getLogger(__name__)


class TrainerLink:
    def __init__(self, run_state: ProxyRunState, rejections: ThrottledWarning) -> None:
        self.run_state = run_state
        self.rejections = rejections

    def hello(self, peer: bytes, msg: messages.Hello) -> messages.Message:
        """Number a new trainer life (or welcome a known one back) once it proves to be this
        run's trainer: same protocol, seed and live arms, a segment this proxy numbered, and
        either the live life itself or a new one whose predecessor is provably gone."""
        run_state = self.run_state
        refusal = self._hello_refusal(msg)
        if refusal is None and (refusal := run_state.peers.refusal(msg)) is not None:
            self.rejections.warning("refused a hello: %s", refusal)
        if refusal is not None:
            return messages.Reply(id=msg.id, ok=False, error=refusal)
        if msg.segment is None:
            segment = run_state.new_segment(peer, msg)
            if msg.resume_step:
                log.info(
                    "trainer segment %d connected, resuming after step %d", segment, msg.resume_step
                )
            else:
                log.info("trainer segment %d connected, starting a fresh run", segment)
        else:
            segment = msg.segment
            run_state.known_segment(peer, msg, segment)
            log.info("trainer segment %d reconnected", segment)
        b = run_state.book.bandit
        return messages.Welcome(
            id=msg.id,
            segment=segment,
            phase=b.phase,
            phase_start_step=b.phase_start_step,
            lag=run_state.book.lag,
            phases=self._phases(),
        )

    def _hello_refusal(self, msg: messages.Hello) -> str | None:
        """Why this hello is refused, or None. A seed or arm set that differs from what the proxy
        read may be a deliberate change of run.toml: it is re-read before judging."""
        run_state = self.run_state
        if msg.protocol != messages.PROTOCOL:
            return f"protocol {msg.protocol}, this proxy speaks {messages.PROTOCOL}"
        if msg.segment is not None and msg.segment > run_state.max_segment + 1:
            # Segments are numbered here and made durable before the trainer hears them; one past
            # the highest known is the most a lost or older .state.json can hide.
            return f"segment {msg.segment} was never numbered (highest: {run_state.max_segment})"
        if msg.seed != run_state.opts.cfg.seed or set(run_state.book.bandit.live_arms) - set(
            msg.arms
        ):
            run_state.reload_config()
        if msg.seed != run_state.opts.cfg.seed:
            return f"trainer seed {msg.seed} differs from run.toml's {run_state.opts.cfg.seed}"
        missing = sorted(set(run_state.book.bandit.live_arms) - set(msg.arms))
        if missing:
            return f"the trainer lacks live arms {missing}"
        return None

    def _phases(self) -> list[messages.PhaseStart]:
        starts = self.run_state.book.starts
        return [messages.PhaseStart(phase=p, after_step=s) for p, s in sorted(starts.items())]

    def assign(self, msg: messages.AssignRequest) -> messages.Message:
        book = self.run_state.book
        items, waiting = [], None
        for step in range(msg.from_step, msg.from_step + msg.count):
            arm = book.assign(step)
            if arm is None:
                waiting = book.waiting_for(step)
                break
            phase = book.phase_of(step)
            # Only the current phase's steps can carry a probe its bandit reads.
            probe = book.bandit.probe_arms(step) if phase == book.bandit.phase else None
            items.append(messages.Assignment(step=step, arm=arm, phase=phase, probe=probe))
        return messages.Assignments(
            id=msg.id, items=items, waiting_for_step=waiting, phases=self._phases()
        )

    def _entry_problem(self, e: LossEntry) -> str | None:
        """Why `e` cannot be a record of a step the trainer trained, judged against this proxy's
        own state; None when it can. A genuine trainer trains only arms this proxy assigned, and
        an assignment needs the losses it depends on to be durable here already, so the arm of
        every genuine step can be recomputed now (and is the same: assignments are pure)."""
        run_state, book = self.run_state, self.run_state.book
        if e.segment > run_state.max_segment:
            return f"step {e.step}: segment {e.segment} was never numbered (highest: {run_state.max_segment})"
        if e.phase > book.bandit.phase:
            return f"step {e.step}: phase {e.phase} is after the current phase {book.bandit.phase}"
        if e.phase < book.phase_of(e.step) or (
            e.phase < book.bandit.phase and e.step <= book.phase_start and e.step not in book.past
        ):
            # Superseded: trained past a pivot's boundary under the old phase (the manual pivot,
            # before the trainer rolled back). Kept in the log, counted by nothing. Or a step of an
            # ended phase, up to the boundary, that the log lacks: its record was not durable yet
            # when the old proxy stopped (the manual pivot stops it right after the trainer's
            # checkpoint, which is the boundary). Either way the old phase's bandit that assigned
            # it is archived, so only its arm can be checked.
            if e.arm not in {c.name for c in run_state.configured}:
                return f"step {e.step}: arm {e.arm!r} is not an arm of this run"
            return None
        try:
            expected = book.assign(e.step)
        except ValueError as err:  # a step of an earlier phase that was never trained
            return f"step {e.step}: {err}"
        if expected is None:
            return f"step {e.step} was never assigned (the losses it depends on are not logged)"
        if e.arm != expected:
            return f"step {e.step} was assigned arm {expected!r}, not {e.arm!r}"
        return None

    def _stranger(
        self, peer: bytes, msg: messages.LossReport | messages.EvalReport | messages.SampleReport
    ) -> messages.Reply | None:
        """The refusal of a record from a peer that is not the live trainer life, or None."""
        if self.run_state.peers.speaks_for_live(peer):
            return None
        error = f"{messages.UNKNOWN_PEER}: say hello first ('{msg.type}' refused, nothing written)"
        self.rejections.warning(
            "refused '%s' from a peer that is %s", msg.type, messages.UNKNOWN_PEER
        )
        return messages.Reply(id=msg.id, ok=False, error=error)

    def losses(self, peer: bytes, msg: messages.LossReport) -> messages.Message:
        if (refused := self._stranger(peer, msg)) is not None:
            return refused
        for e in msg.entries:
            problem = self._entry_problem(e)
            if problem is not None:
                # Nothing of the message is written: one bad entry makes the whole report suspect.
                self.rejections.warning("rejected a loss report: %s", problem)
                return messages.Reply(id=msg.id, ok=False, error=f"losses rejected: {problem}")
        self.run_state.append_losses(msg.entries)
        return messages.LossAck(id=msg.id, keys=[(e.segment, e.step) for e in msg.entries])

    def eval(self, peer: bytes, msg: messages.EvalReport) -> messages.Message:
        if (refused := self._stranger(peer, msg)) is not None:
            return refused
        self.run_state.append_eval(msg.entry)
        return messages.EvalAck(id=msg.id, key=(msg.entry.segment, msg.entry.step))

    def samples(self, peer: bytes, msg: messages.SampleReport) -> messages.Message:
        if (refused := self._stranger(peer, msg)) is not None:
            return refused
        run_state = self.run_state
        if msg.segment > run_state.max_segment or msg.phase > run_state.book.bandit.phase:
            error = f"samples of segment {msg.segment}, phase {msg.phase}: never numbered"
            self.rejections.warning("rejected a sample report: %s", error)
            return messages.Reply(id=msg.id, ok=False, error=error)
        owner = run_state.book.phase_of(msg.step)
        if msg.phase != owner:
            log.info(
                "samples of step %d (phase %d) are superseded by the pivot to phase %d; not kept",
                msg.step,
                msg.phase,
                owner,
            )
        else:
            run_state.keep_samples(msg)
        return messages.Reply(id=msg.id, ok=True)
