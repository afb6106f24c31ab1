"""When and where the trainer checkpoints: the one place that decides.

The loop says why at a step boundary (`save("cadence")` after every fresh step, `save(reason)` for
an agreed request or a pivot's boundary) and `final(decision)` when it ends, with the closing
decision every rank agreed on; this module decides
whether that calls for a checkpoint, writes it synchronously or in the background, answers whoever
asked, and keeps systemd's timeouts long enough for it. Every rank calls it at the same boundary
(the states of every rank are gathered to rank 0); rank 0 alone writes. What a checkpoint holds:
snapshot.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial

from andrea.daemon.checkpoint.manager import CheckpointManager
from andrea.daemon.checkpoint.manifest import Manifest, Trigger
from andrea.daemon.checkpoint.training.snapshot import Gathered, Snapshotter, gather_ranks
from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.rundir.losslog import LossLogError
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.links.control_server import ControlServer
from andrea.daemon.trainer.platform.distributed import Decision
from andrea.daemon.trainer.sink import RecordSink

log = logging.getLogger(__name__)


def newest_checkpoint(last_saved: int) -> str:
    """The newest checkpoint a log line names: `step N`, or that there is none yet (a run that
    diverges or fails to write before its first checkpoint has nothing to start again from)."""
    return f"the newest checkpoint is step {last_saved}" if last_saved else "no checkpoint yet"


@dataclass(frozen=True)
class Storage:
    """Rank 0's: the host buffer a checkpoint is staged in, and the manager that writes, finds
    and retires checkpoints (the other ranks of a job write none)."""

    snapshots: Snapshotter
    manager: CheckpointManager
    #: The control socket, told when a requested checkpoint is durable.
    control: ControlServer

    @classmethod
    def of(
        cls, ctx: TrainerContext, control: ControlServer | None, backend: str | None
    ) -> Storage | None:
        """Rank 0's storage: None on the other ranks, which have no control socket either.
        `backend`: the job's process-group backend, recorded in its manifests."""
        if control is None:
            return None
        snapshots = Snapshotter(ctx, backend)
        manager = CheckpointManager(
            ctx.run_dir, ctx.cfg.checkpoint, read_buffer=snapshots.staging.array
        )
        return cls(snapshots, manager, control)


class Checkpointer:
    """The trainer's checkpoint policy: cadence, boundary, request and final checkpoints."""

    def __init__(
        self,
        ctx: TrainerContext,
        storage: Storage | None,
        sink: RecordSink,
        config_changed: bool,
    ) -> None:
        """`sink`: where the records go (the loss history must be durable before a checkpoint
        commits); `config_changed`: a change accepted with --allow-config-change that no
        checkpoint records yet (the resume says)."""
        self.ctx = ctx
        self.storage = storage
        self.sink = sink
        self.config_changed = config_changed
        self.last_write_seconds = 0.0
        #: The step at which the run diverged (a non-finite loss, or weights): no checkpoint is
        #: written from then on, so retention never rotates the last finite one out.
        self.diverged: int | None = None
        #: Why the final checkpoint was not written, when it was not (what `stop --wait` prints).
        self.failure: str | None = None

    # ---- the policy --------------------------------------------------------------------------

    def grace_seconds(self) -> float:
        """How long to ask systemd for a checkpoint write: four times the last one, 30 s at least."""
        return max(30.0, 4 * self.last_write_seconds)

    def boundary_allowed(self, step: int) -> bool:
        """Whether a pivot's boundary checkpoint may be taken after `step` (a cadence point)."""
        every = self.ctx.cfg.checkpoint.every
        return every == 0 or step % every == 0

    def save(self, reason: Trigger) -> bool:
        """Checkpoint the current step for `reason`, if the policy says so. Every rank calls it at
        the same step boundary, and gets the same answer.

        "cadence": after every fresh step; only a step on the cadence is checkpointed, in the
        background when so configured. "boundary", "sigusr1", "control": an agreed request,
        written synchronously (whoever asked is told once it is durable). True when the step
        called for a checkpoint, whether or not it could be written."""
        step = self.ctx.counters.step
        if reason != "cadence":
            self._requested(reason)
            return True
        every = self.ctx.cfg.checkpoint.every
        if not (every > 0 and step % every == 0):
            return False
        gathered = self._gather()
        if self.storage is None or self.sink.unlogged is not None:
            return True
        if self.ctx.cfg.checkpoint.async_write:
            self.write_in_background("cadence", gathered)
        else:
            self._write_and_continue(self.storage, "cadence", gathered)
        return True

    def _gather(self) -> Gathered:
        """Every rank: the job's state for rank 0's write (see `gather_ranks`)."""
        snapshots = self.storage.snapshots if self.storage is not None else None
        return gather_ranks(self.ctx, snapshots, self.wait_for_write)

    def _requested(self, reason: Trigger) -> None:
        step, store = self.ctx.counters.step, self.storage
        if step == 0:
            if store is not None:
                log.warning(
                    "checkpoint requested (%s) before the first step: there is nothing to save yet",
                    reason,
                )
                store.control.checkpoint_served(
                    {"step": 0}, error="nothing trained yet: there is no step to checkpoint"
                )
            return
        gathered = self._gather()
        if store is None:
            return
        if self.sink.unlogged is not None:
            store.control.checkpoint_served(
                {"step": step},
                error=f"the loss of step {step} could not be written; no checkpoint of it",
            )
            return
        self._write_and_continue(store, reason, gathered)
        if self.ctx.counters.last_saved == step:
            store.control.checkpoint_served({"step": step, "checkpoint": bin_name(step)})
        else:
            store.control.checkpoint_served(
                {"step": step}, error=f"checkpoint of step {step} failed (see the trainer's log)"
            )

    def _write_and_continue(
        self, store: Storage, trigger: Trigger, gathered: Gathered | None
    ) -> None:
        # Requested checkpoints are synchronous: whoever asked is told once it is durable. A
        # background write of this very step that was in flight serves the request.
        # A failed write mid-run (disk full, say) must not end a multi-day run: the previous
        # checkpoint stays valid, the error is logged, and the next cadence point tries again.
        self.wait_for_write()
        step = self.ctx.counters.step
        if self.ctx.counters.last_saved == step:
            if store.manager.mark_requested(step, trigger):
                log.info(
                    "checkpoint of step %d already written; kept as requested (%s)", step, trigger
                )
                return
            log.warning(
                "the checkpoint of step %d is gone from the run directory; writing it", step
            )
        try:
            with self.ctx.notifier.keepalive(f"writing checkpoint of step {step} ({trigger})"):
                self.write(trigger, gathered)
        except OSError as e:
            log.error(
                "checkpoint of step %d (%s) FAILED: %s; training continues (%s)",
                step,
                trigger,
                e,
                newest_checkpoint(self.ctx.counters.last_saved),
            )

    def diverge(self, step: int, what: str) -> None:
        """The run diverged at `step` (`what` was not finite): stop at the next boundary, write no
        checkpoint of it or after it, and exit CONFIG_ERROR. A restart from the newest checkpoint
        would train the same steps bit for bit and diverge again: a person must change something
        (the learning rate, its warmup, the data)."""
        if self.diverged is None:
            self.diverged = step
            log.error(
                "step %d: %s is not finite: the run diverged. No checkpoint is written from here on"
                " (%s). Lower optim.lr (or lengthen optim.warmup_steps, or set"
                " optim.grad_clip) before starting again",
                step,
                what,
                newest_checkpoint(self.ctx.counters.last_saved),
            )
        self.ctx.flags.request_stop("diverged")

    def _finite_weights(self) -> bool:
        """Whether every weight is finite (one device sync). A loss can still be finite at the
        step whose update made the weights infinite or NaN (an overflowing gradient)."""
        parts = self.ctx.parts
        if self.diverged is None and not parts.parallel.weights_finite(parts.params):
            self.diverge(self.ctx.counters.step, "the weights")
        return self.diverged is None

    # ---- the end -----------------------------------------------------------------------------

    def finish_background_write(self) -> None:
        """Rank 0, stopping: a background write in flight is waited for (never abandoned
        half-way); the final checkpoint follows unless that write already holds the newest step."""
        extend = self.grace_seconds()
        if self.storage is not None and (writing := self.storage.manager.in_flight()) is not None:
            log.info("waiting for the checkpoint of step %d being written", writing)
            with self.ctx.notifier.keepalive(f"finishing the checkpoint of step {writing}", extend):
                self.wait_for_write()

    def final(self, agreed: Decision) -> ExitCode:
        """Every rank, at the end: the final checkpoint of the newest step, if it has none yet
        (rank 0 writes; the others answer OK), its trigger the closing decision every rank
        `agreed` on (`Trainer.finish`). CHECKPOINT_FAILED when it could not be written."""
        c, store = self.ctx.counters, self.storage
        gathered = self._gather() if c.step > 0 else None
        if store is None:
            return ExitCode.OK
        if self.diverged is not None:
            log.error(
                "no final checkpoint: the run diverged at step %d; exit %d, not restarted (%s):"
                " a start from where it stands would diverge again the same way",
                self.diverged,
                ExitCode.CONFIG_ERROR,
                newest_checkpoint(c.last_saved),
            )
            return ExitCode.CONFIG_ERROR
        trigger: Trigger = agreed.stop if agreed.stop is not None else "end"
        # A checkpoint request that came with the stop is served by the final checkpoint, which
        # then counts as requested (an audit point kept by retention).
        requested = agreed.checkpoint
        # After an accepted config change the newest checkpoint must carry the new config, or the
        # next plain restart would be refused against the old one: it is written again. So is one
        # a person removed (`andreactl prune --include-newest`) while the trainer ran.
        rewrite = c.step > 0 and (self.config_changed or not store.manager.holds(c.step))
        if requested is not None and (c.step > c.last_saved or rewrite):
            trigger = requested
        elif requested is not None and c.step > 0:
            rewrite = not store.manager.mark_requested(c.step, requested)
        if self.sink.unlogged is not None and not self.sink.retry_unlogged():
            self.failure = (
                f"no final checkpoint: the loss of step {c.step} could not be written; the newest"
                f" valid checkpoint is step {c.last_saved or 'none'}, and a restart once there is"
                " space resumes from it"
            )
            log.error("%s", self.failure)
            return ExitCode.CHECKPOINT_FAILED
        if c.step <= c.last_saved and not rewrite:
            log.info("step %d is already checkpointed; nothing to write", c.step)
            return ExitCode.OK
        try:
            extend = self.grace_seconds()
            with self.ctx.notifier.keepalive(f"writing final checkpoint of step {c.step}", extend):
                self.write(trigger, gathered)
        except (OSError, LossLogError) as e:
            self.failure = (
                f"final checkpoint of step {c.step} FAILED ({e}); the newest valid checkpoint is"
                f" step {c.last_saved or 'none'}"
            )
            log.error("%s", self.failure)
            return ExitCode.CHECKPOINT_FAILED
        return ExitCode.OK

    # ---- the writes (rank 0) -----------------------------------------------------------------

    def _rank0(self) -> Storage:
        if self.storage is None:
            raise RuntimeError("only global rank 0 writes checkpoints")
        return self.storage

    def write(self, trigger: Trigger, gathered: Gathered | None = None) -> None:
        """Write a checkpoint of the current step, durably, before returning (after a background
        write in flight, if any, has finished)."""
        t0 = time.perf_counter()
        store = self._rank0()
        store.manager.wait()
        if not self._finite_weights():
            return
        snap = store.snapshots.take(self.sink, gathered)
        manifest = store.manager.save(snap, trigger, before_commit=self.sink.sync)
        c = self.ctx.counters
        c.last_saved = c.step
        self.config_changed = False
        c.last_saved_at = time.time()
        c.checkpoints_written += 1
        self.last_write_seconds = time.perf_counter() - t0
        log.info(
            "checkpoint %s written (%s, %.1f MB, %.2f s)",
            manifest.bin_file,
            trigger,
            manifest.bin_size / 1e6,
            self.last_write_seconds,
        )

    def write_in_background(self, trigger: Trigger, gathered: Gathered | None = None) -> None:
        """Stage the current step's state (the only part training waits for), then write and fsync
        it on the writer thread while training continues. A write still in flight is waited for
        first: a cadence checkpoint is delayed, never skipped."""
        t0 = time.perf_counter()
        store = self._rank0()
        store.manager.wait()
        if not self._finite_weights():
            return
        snap = store.snapshots.take(self.sink, gathered)
        store.manager.save_async(
            snap,
            trigger,
            on_done=partial(self._written, store, snap.step, trigger),
            before_commit=self.sink.sync,
        )
        log.debug(
            "checkpoint of step %d handed over in %.4f s (training held); the copy to host "
            "memory and the write go on in the background",
            snap.step,
            time.perf_counter() - t0,
        )

    def _written(
        self,
        store: Storage,
        step: int,
        trigger: Trigger,
        manifest: Manifest | None,
        error: BaseException | None,
        seconds: float,
    ) -> None:
        # On the writer's thread. last_saved moves only once the manifest is committed.
        c = self.ctx.counters
        if manifest is not None:
            c.last_saved = max(c.last_saved, step)
            c.last_saved_at = time.time()
            c.checkpoints_written += 1
            self.last_write_seconds = seconds
            log.info(
                "checkpoint %s written (%s, %.1f MB, %.2f s in the background; staged in %.3f s)",
                manifest.bin_file,
                trigger,
                manifest.bin_size / 1e6,
                seconds,
                store.snapshots.staging.staged_seconds or 0.0,
            )
        elif isinstance(error, OSError):
            log.error(
                "checkpoint of step %d (%s) FAILED: %s; training continues, newest valid is step %s",
                step,
                trigger,
                error,
                c.last_saved or "none",
            )
        else:
            log.error("checkpoint of step %d (%s) FAILED unexpectedly: %r", step, trigger, error)

    def before_update(self) -> None:
        """Before the optimizer writes the weights and moments: on CUDA the compute stream waits
        for a checkpoint's copy of them still in flight (rank 0; a no-op elsewhere)."""
        if self.storage is not None:
            self.storage.snapshots.staging.guard()

    def wait_for_write(self) -> None:
        """Block until no background checkpoint write is in flight (rank 0; others never write)."""
        if self.storage is not None:
            self.storage.manager.wait()

    def mark_requested(self, step: int, trigger: Trigger) -> None:
        """Keep the existing checkpoint of `step` as an audit point (rank 0)."""
        if self.storage is not None:
            self.storage.manager.mark_requested(step, trigger)

    def close(self) -> None:
        """Finish a write in flight (it syncs the records before committing), stop retention."""
        if self.storage is not None:
            self.storage.manager.close()
