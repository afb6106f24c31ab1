"""The trainer's side of a pivot: it holds at a boundary checkpoint while the proxy commits a new
phase, takes the phase the proxy releases it with, and rolls back when the proxy started a phase
that this trainer already trained past (the manual pivot)."""

from __future__ import annotations

import logging
import time

from andrea.daemon.checkpoint.training.checkpointer import Checkpointer
from andrea.daemon.checkpoint.training.restore import Restorer
from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.runtime.operator_requests import REQUESTED_TRIGGERS
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.links.hold_registry import Hold, gone
from andrea.daemon.trainer.reporting import Reporter
from andrea.daemon.trainer.sink import RecordSink
from andrea.protocol.status import Activity

log = logging.getLogger(__name__)


class PhaseFollower:
    """Holds and roll-backs. Every rank holds alike (agreeing every 50 ms); a roll-back is a
    single process's only: a torchrun job refuses a manual pivot it ran past (docs/operations.md)."""

    def __init__(
        self,
        ctx: TrainerContext,
        sink: RecordSink,
        checkpointer: Checkpointer,
        restorer: Restorer,
        reporter: Reporter,
    ) -> None:
        self.ctx = ctx
        self.main = ctx.main
        self.sink = sink
        self.checkpointer = checkpointer
        self.restorer = restorer
        self.reporter = reporter
        #: A torchrun job said once that it cannot roll back to a pivot it ran past.
        self._refused_rollback = False

    def after_boundary(self, hold: bool) -> None:
        """After an agreed boundary checkpoint: hold when a pivot asked for it (`hold`). A failed
        boundary checkpoint fails the hold (the pivot cannot start from it) and releases it."""
        step = self.ctx.counters.step
        pending = self.ctx.holds.due() if self.main else None
        if hold and pending is not None and self.ctx.counters.last_saved != step:
            self.ctx.holds.fail(pending.id, f"the boundary checkpoint of step {step} failed")
            self.ctx.flags.request_resume()
        if hold:
            self._hold()

    def _hold(self) -> None:
        """Wait at a boundary checkpoint until resumed (the proxy pivots meanwhile), honouring stop
        and checkpoint requests. The resume carries the proxy's new phase, whose arms replace
        the prefetched ones of the old phase. Every way out is certain: a resume naming the hold, its timeout, a stop;
        and when no hold began (cancelled while the boundary was evaluated and checkpointed, or
        failed), rank 0 asks for the agreed resume at once, again at every turn."""
        hold = self._begin()
        acknowledged = self._announce(hold)
        while True:
            if self.main and not acknowledged:
                # Ready for the pivot once the proxy has every record up to this step, the
                # boundary's sample included.
                acknowledged = self.sink.acknowledged()
                if acknowledged:
                    self.ctx.holds.mark_acknowledged()
            if self.main and hold is not None and self._expired(hold):
                hold = None
            if self.main and hold is None:
                self.ctx.flags.request_resume()
            d = self.ctx.coord.agree(self.ctx.flags, holding=True)
            if d.checkpoint is not None:
                self.checkpointer.save(d.checkpoint)
            if d.stop is not None:
                return
            if d.resume:
                self._resumed(hold)
                return
            self.ctx.notifier.tick()
            time.sleep(0.05)

    def _begin(self) -> Hold | None:
        """Rank 0: the hold that begins at this boundary; None when none can (the other ranks
        hold for rank 0's)."""
        if not self.main:
            return None
        hold = self.ctx.holds.due()
        if hold is not None and self.ctx.holds.begin(hold.id, self.ctx.counters.step):
            return hold
        log.info(
            "no pivot holds this trainer after the checkpoint of step %d any more (cancelled or "
            "failed meanwhile); training continues",
            self.ctx.counters.step,
        )
        return None

    def _expired(self, hold: Hold) -> bool:
        """Whether `hold` timed out, which drops it (the client that asked for it died)."""
        if not self.ctx.holds.expired(hold.id):
            return False
        log.warning(
            "hold %s: no resume within %.0f s of holding after step %d; continuing under "
            "the proxy's current phase (a pivot the proxy made meanwhile still applies)",
            hold.id,
            hold.timeout_s,
            self.ctx.counters.step,
        )
        self.ctx.holds.drop(hold.id, gone(hold.id, f"no resume within {hold.timeout_s:.0f} s"))
        return True

    def _announce(self, hold: Hold | None) -> bool:
        """Rank 0 says it holds. True when nothing is left to acknowledge before a pivot (a proxy
        still has records to acknowledge; the other ranks never wait for that, nor does a
        boundary where no hold began)."""
        if not self.main or hold is None:
            return True
        step = self.ctx.counters.step
        self.ctx.counters.activity = Activity.HOLDING
        self.reporter.publish_metrics(force=True)
        self.ctx.notifier.status(f"step {step}: holding at a boundary checkpoint")
        log.info("holding after the checkpoint of step %d (hold %s) until resumed", step, hold.id)
        acknowledged = self.sink.acknowledged()
        if acknowledged:
            self.ctx.holds.mark_acknowledged()
        return acknowledged

    def _resumed(self, hold: Hold | None) -> None:
        """Go on under the phase the release carried; without one (a cancel, a timeout, a pivot
        given up) ask the proxy again, which answers with its current phase."""
        step = self.ctx.counters.step
        new_phase = self.ctx.holds.take_release(hold.id) if hold is not None else None
        if new_phase is not None and new_phase.after_step == step:
            self.sink.enter_phase(new_phase)
            log.info("resumed after step %d in phase %d", step, new_phase.phase)
            return
        self.sink.restart_after(step)
        if self.main:
            log.info("resumed after step %d", step)

    def follow(self) -> bool:
        """Roll back to a pivot's boundary if the proxy started a phase whose first step this
        trainer already trained under an older phase (the manual pivot while it ran ahead, or a
        resume from a checkpoint of the old phase). True when it rolled back."""
        c = self.ctx.counters
        target = self.sink.rollback_target(c.step, c.phase)
        if target is None:
            return False
        phase, boundary = target
        if self.ctx.world.distributed:
            # Only rank 0 hears the proxy, and it takes no arm of the new phase: the job waits.
            if not self._refused_rollback:
                self._refused_rollback = True
                log.error(
                    "the proxy started phase %d after step %d, but this torchrun job trained up to "
                    "step %d under phase %d, and a job does not roll back by itself: it waits for "
                    "arms it cannot take. Stop it and pivot as docs/operations.md says for DDP "
                    "runs (stop the job first)",
                    phase,
                    boundary,
                    c.step,
                    c.phase,
                )
            return False
        log.warning(
            "the proxy started phase %d after step %d, but this trainer trained up to step %d under "
            "phase %d: rolling back to %s (the steps after it stay in .loss.json as superseded)",
            phase,
            boundary,
            c.step,
            c.phase,
            bin_name(boundary),
        )
        self.checkpointer.wait_for_write()
        manifest = self.restorer.roll_back_to(boundary)
        # A pivot boundary is an audit point: retention keeps it like `andreactl pivot`'s.
        if manifest.trigger not in REQUESTED_TRIGGERS:
            self.checkpointer.mark_requested(boundary, "boundary")
        self.sink.restart_after(boundary, new_segment=True)
        return True
