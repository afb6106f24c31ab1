"""The training loop of andrea-trainer: train, stop.

Everything that decides a bit of the trajectory is either saved in the checkpoint (weights, Adam's
m and v and step count, every RNG, each arm's cursor, progress) or a pure function of the step
(learning rate, the arm of each step, each epoch's data order). The loop only orders the work at
a step boundary; each piece lives in its own module:

- factory.py: builds the context (context.py) once, then every collaborator below, resumed;
- parts.py: the platform, data, model and optimizer; step.py: one optimizer step;
- checkpoint/training/restore.py: a checkpoint back into the live state, and whether the resume
  is exact; checkpoint/training/checkpointer.py: when and where a checkpoint is written (cadence,
  boundary, request, final); checkpoint/training/snapshot.py: what it holds;
- sink.py: where the records go and where the arms come from (fixed mode or the proxy);
- phase_follower.py: the hold at a pivot's boundary, the phase the proxy releases it with, and
  the roll-back to a phase that starts behind the trainer;
- evaluation.py: held-out evaluation and samples; reporting.py: progress, metrics, summary.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import IO

import torch

from andrea.daemon.checkpoint.training.checkpointer import Checkpointer
from andrea.daemon.checkpoint.training.restore import Restorer
from andrea.daemon.data.livefiles import RESUME_ADVICE, DataWatch, TokensChanged
from andrea.daemon.metrics.series import ema_update
from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.trainer.context import TrainerContext, starting_status
from andrea.daemon.trainer.evaluation import Evaluation
from andrea.daemon.trainer.links.control_server import ControlServer
from andrea.daemon.trainer.phase_follower import PhaseFollower
from andrea.daemon.trainer.platform import distributed as dist
from andrea.daemon.trainer.reporting import Reporter
from andrea.daemon.trainer.sink import RecordSink
from andrea.daemon.trainer.step import StepRunner, TrainedStep
from andrea.protocol.status import Activity, TrainerStatus

log = logging.getLogger(__name__)

#: Test-only pacing: seconds to sleep after each step. The tests that drive long-running trainers
#: under a real systemd wait for events (a reload, a restart), not for steps; unpaced, andrea-tiny
#: trains flat out meanwhile and costs them a core. Nothing a step computes depends on it.
PACE_ENV = "ANDREA_TEST_STEP_PAUSE"


@dataclass(frozen=True)
class Collaborators:
    """What the loop orders at a step boundary, each built once by `factory.build_trainer`."""

    restorer: Restorer
    sink: RecordSink
    checkpointer: Checkpointer
    stepper: StepRunner
    evaluation: Evaluation
    reporter: Reporter
    pivots: PhaseFollower
    #: Rank 0's control socket and run-directory lock; None on the other ranks of a job.
    control: ControlServer | None
    lock: IO[bytes] | None


class Trainer:
    """One life of the trainer process over one run directory (it trains one segment or more).

    In a torchrun job every rank runs one Trainer. Global rank 0 alone owns the control socket,
    the proxy link (or the loss log), systemd notifications and the checkpoint writes; every
    decision that changes what ranks do next (stop, checkpoint, hold, the arm of the next step) is
    agreed at a step boundary by one collective (`distributed.Coordinator`)."""

    def __init__(self, ctx: TrainerContext, collaborators: Collaborators) -> None:
        """Built by `factory.build_trainer`, resumed: ready to `run`."""
        self.ctx = ctx
        c = collaborators
        self.restorer = c.restorer
        self.sink = c.sink
        self.checkpointer = c.checkpointer
        self.stepper = c.stepper
        self.evaluation = c.evaluation
        self.reporter = c.reporter
        self.pivots = c.pivots
        self.control = c.control
        self.lock = c.lock
        #: Steps trained whose loss is not recorded yet, oldest first (at most two: `_agree`).
        self._unrecorded: list[TrainedStep] = []
        #: Losses may be read one step late: in fixed mode (the proxy may need each at once).
        self._late_loss = ctx.cfg.mixing == "fixed"
        #: The step recorded last (None before the first), and the newest step a checkpoint was
        #: taken of: the time of the step after a checkpoint is logged (the copy to host memory
        #: runs beside it).
        self._previous: TrainedStep | None = None
        self._checkpointed = 0
        #: The run's token files, compared with what it opened at every step boundary.
        self.data = DataWatch(ctx.parts.arms)
        #: Each arm's index, the form in which the agreement carries a probe request.
        self._arm_index = {a.name: i for i, a in enumerate(ctx.parts.arms)}
        self._pace = float(os.environ.get(PACE_ENV) or 0)

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> ExitCode:
        """Train until max_steps or an agreed stop; always leave the newest state checkpointed.

        At each step boundary every rank takes part in one agreement (`Coordinator.agree`) that
        carries a loss (`_agree` says whose), any rank's stop or checkpoint request, and the arm
        of the next step; everything after it is the same on every rank."""
        cfg, c = self.ctx.cfg, self.ctx.counters
        self.restorer.restore_rng()
        if self._pace:
            log.warning("%s: pausing %g s after each step (a test setting)", PACE_ENV, self._pace)
        self.ctx.notifier.ready(f"step {c.step}/{cfg.max_steps}")
        self.reporter.restart_window()
        self.reporter.waiting_over()
        settled = c.step  # the newest step whose cadence, boundary and samples are done
        while True:
            if self.pivots.follow():
                settled = c.step
                continue
            fresh = c.step > settled
            self._watch_data()
            d = self._agree(fresh)
            # Alone: no checkpoint of a step whose loss is not on disk; finish retries it. In a
            # job the stop for an unlogged loss reaches the other ranks with the next agreement;
            # until then rank 0 goes the others' way (it trains with them, takes part in
            # checkpoints but writes none): only rank 0 knows, and a path of its own would pair
            # its next collective with another one of theirs.
            if self.sink.unlogged is not None and not self.ctx.world.distributed:
                break
            worked = False
            if (ignored := self.ctx.flags.take_ignored_signal()) is not None:
                log.info("%s received and ignored (see docs/operations.md)", ignored)
            if fresh:
                settled = c.step
                worked = self._after_step(d.boundary, d.hold) or worked
            if d.checkpoint is not None:
                self.checkpointer.save(d.checkpoint)
                worked = True
            if d.stop is None and c.step >= cfg.max_steps and self.pivots.follow():
                # A pivot heard at the last step: its steps are trained again in the new phase,
                # rather than the run ending on steps that the pivot superseded.
                settled = c.step
                continue
            if d.stop is not None or c.step >= cfg.max_steps:
                break
            if worked:
                continue  # a request may have come in meanwhile: agree again before a new step
            if d.arm is None:
                self.reporter.waiting_for_proxy(c.step + 1)
                continue
            if self.evaluation.catch_up():
                continue  # a stop that cut it short reaches every rank at the next agreement
            if not self._train(d.arm, d.probe):
                break
        return self.finish()

    def _train(self, arm: int, probe: tuple[int, ...]) -> bool:
        """Train the next step; False when its tokens could not be read as the run opened them
        (changed after this boundary's check). Alone, nothing of the step was done, so the newest
        step is checkpointed as for a stop. In a job the other ranks are inside the step already:
        this rank exits (DATA_ERROR, service/cli.py), torchrun ends the job, and the newest
        checkpoint stays the resume point."""
        t0 = time.perf_counter()
        try:
            trained = self.stepper.train(arm)
        except TokensChanged as e:
            if self.ctx.world.distributed:
                raise
            self._data_changed(str(e))
            return False
        self.ctx.counters.train_seconds += time.perf_counter() - t0
        if self._pace:
            time.sleep(self._pace)
        # The probe scores the weights after this step, before the next one changes them: rank 0
        # alone, or every rank where a forward pass is a collective (the agreement told them).
        if probe and (self.ctx.main or self.evaluation.joint):
            trained.probe = self.evaluation.probe([self.ctx.parts.arms[i].name for i in probe])
        self._unrecorded.append(trained)
        return True

    def _watch_data(self) -> None:
        """A token file changed under the run: a stop, which the agreement carries to every rank
        (all of them check; one that sees it is enough)."""
        if self.ctx.flags.stop_reason is None and (why := self.data.changed()) is not None:
            self._data_changed(why)

    def _data_changed(self, why: str) -> None:
        log.error(
            "%s. Stopping at step %d with a checkpoint of it (its steps were trained on the file "
            "as the run opened it); exit %d, not restarted: %s",
            why,
            self.ctx.counters.step,
            ExitCode.DATA_ERROR,
            RESUME_ADVICE,
        )
        self.ctx.flags.request_stop("data-changed")

    def _agree(self, fresh: bool) -> dist.Decision:
        """The step boundary's agreement, and the records of the steps whose losses it reads.

        A step's loss is read one step late: at the boundary after the next step was queued,
        when its own kernels are long done, so that the host never waits for the device between
        steps. It is read at its own boundary where that needs it — the same on every rank: a
        log point, a checkpoint, an evaluation or samples, the last step (`_loss_due`), or an
        agreed stop, checkpoint, pivot or wait for the proxy — and always with the proxy, which
        may need it to assign the next step. A stop therefore still acts at the boundary it
        arrived at, with every step up to it recorded."""
        c, pending = self.ctx.counters, self._unrecorded
        arm = self.sink.arm_for(c.step + 1) if c.step < self.ctx.cfg.max_steps else None
        probed = (self.sink.probe_for(c.step + 1) or []) if arm is not None else []
        carried = pending[0] if len(pending) > 1 or (pending and self._loss_due(c.step)) else None
        d = self.ctx.coord.agree(
            self.ctx.flags,
            at_boundary=fresh and self.checkpointer.boundary_allowed(c.step),
            arm=arm,
            loss=self._read(carried) if carried is not None else None,
            probe=[self._arm_index[n] for n in probed if n in self._arm_index],
        )
        if carried is not None:
            self._record(pending.pop(0), d.loss)
        agreed = d.stop or d.checkpoint or d.boundary or d.hold or d.arm is None
        if pending and (agreed or self._loss_due(pending[0].step)):
            self._record_pending_losses()
        return d

    def _loss_due(self, step: int) -> bool:
        """Whether the loss of `step` is read at its own boundary (a pure function of the step
        and the config, so that every rank of a job decides alike)."""
        cfg = self.ctx.cfg

        def on(every: int | None) -> bool:
            return every is not None and every != 0 and step % every == 0

        return (
            not self._late_loss
            or step >= cfg.max_steps
            or on(cfg.log_every)
            or on(cfg.checkpoint.every)
            or on(self.evaluation.every)
            or on(cfg.samples.every)
        )

    def _read(self, trained: TrainedStep) -> float:
        """This rank's loss of `trained`; on a GPU the wait for its kernels counts as training."""
        t0 = time.perf_counter()
        value = trained.value()
        self.ctx.counters.train_seconds += time.perf_counter() - t0
        return value

    def _record_pending_losses(self) -> None:
        """Read and record every step not recorded yet (in a job, each loss's mean over the
        ranks by one collective of every rank, summed as the agreement sums it)."""
        while self._unrecorded:
            mean = self.ctx.coord.mean_loss(self._read(self._unrecorded[0]))
            self._record(self._unrecorded.pop(0), mean)

    def _after_step(self, boundary: bool, hold: bool) -> bool:
        """What a freshly trained step is due, in this order: its evaluation, samples, and
        checkpoint (a pivot's agreed `boundary`, then the `hold`; or the cadence's). True when
        anything but the evaluation ran."""
        c = self.ctx.counters
        worked = False
        # Every decision here is a pure function of the step (or agreed), the same on every rank:
        # rank 0 alone evaluates and samples, but every rank takes the same path, so that each
        # rank's next collective is the others' next one too.
        if self.evaluation.due(c.step):
            # Before the cadence checkpoint, so that its manifest says this step was evaluated.
            with self.reporter.excluded():  # training speed only
                self.evaluation.at_step()
            c.activity = Activity.TRAINING
        # Samples first: the sample of a pivot's boundary belongs to the phase that ends there,
        # so it must reach the proxy before the hold.
        if self.evaluation.samples_due(c.step):
            self.evaluation.samples()
            self.reporter.restart_window()
            worked = True
        if boundary:
            self.checkpointer.save("boundary")
            self.pivots.after_boundary(hold)
            worked = True
        elif self.checkpointer.save("cadence"):
            self._checkpointed = c.step
            worked = True
        return worked

    def _record(self, trained: TrainedStep, loss: float | None) -> None:
        """Rank 0: record the step, with its loss (in a job, the mean over the ranks)."""
        c = self.ctx.counters
        c.activity = Activity.TRAINING
        self.reporter.waiting_over()
        if not self.ctx.main:
            return
        heldout = c.heldout if c.last_eval_step == trained.step - 1 else None
        entry = trained.entry(loss if loss is not None else trained.value(), heldout)
        before, self._previous = self._previous, trained
        if before is not None and before.step == trained.step - 1 == self._checkpointed:
            log.debug(
                "step %d, the first after the checkpoint of step %d: %.1f ms (step %d: %.1f ms)",
                trained.step,
                before.step,
                1000 * trained.seconds(),
                before.step,
                1000 * before.seconds(),
            )
        c.loss_ema = ema_update(c.loss_ema, entry.loss)
        if not self.sink.record_loss(entry):
            # The step is trained but its loss is not on disk: it must not be checkpointed
            # without it (finish tries once more on a reopened log).
            self.ctx.flags.request_stop("disk-full")
            return
        self.reporter.step_done(entry)
        if not math.isfinite(entry.loss):
            # Recorded (a non-finite loss is an event of the run), then the end of it.
            self.checkpointer.diverge(trained.step, f"its loss ({entry.loss})")

    # ---- the end ----------------------------------------------------------------------------

    def finish(self) -> ExitCode:
        """Final checkpoint (if the newest step has none yet), then a clean exit. Every rank; the
        exit code is agreed, so that all ranks of a job end alike.

        Why it ends is read once, from a closing agreement: the stop the loop broke on, or one
        that came after the last step boundary (a full disk's while recording, a signal at
        max_steps), and a checkpoint request that came with it. The final checkpoint's trigger and
        the summary both take it from there, the same on every rank."""
        c = self.ctx.counters
        c.activity = Activity.STOPPING
        self._record_pending_losses()
        self.checkpointer.finish_background_write()
        closing = self.ctx.coord.agree(self.ctx.flags)
        final = self.checkpointer.final(closing)
        if closing.stop == "data-changed" and final == ExitCode.OK:
            final = ExitCode.DATA_ERROR  # checkpointed; a person decides about the data
        code = ExitCode(dist.agree_code(self.ctx.world, int(final)))
        self.close()
        self.reporter.summary(closing.stop)
        if self.evaluation.probes:
            # What the transfer reward's probes cost this life (docs/bandit.md states it).
            log.info(
                "target probes: %d, %.2f s (%.1f%% of the training time)",
                self.evaluation.probes,
                self.evaluation.probe_seconds,
                100 * self.evaluation.probe_seconds / max(c.train_seconds, 1e-9),
            )
        if self.ctx.platform.device.type == "cuda":
            log.info(
                "peak CUDA memory: %.2f GiB allocated, %.2f GiB reserved",
                torch.cuda.max_memory_allocated(self.ctx.platform.device) / 2**30,
                torch.cuda.max_memory_reserved(self.ctx.platform.device) / 2**30,
            )
        if self.control is not None:
            failure = self.checkpointer.failure or f"exit {int(code)} ({code.name}); see its log"
            self.control.close(
                {
                    "step": c.step,
                    "exit_code": int(code),
                    "checkpoint": bin_name(c.last_saved) if c.last_saved else None,
                },
                error=None if code == ExitCode.OK else failure,
            )
        return code

    def close(self) -> None:
        """Finish a checkpoint write in flight, then close the records' files or link."""
        self.checkpointer.close()  # a write in flight syncs the loss log before committing
        self.sink.close()
        self.stepper.close()

    # ---- status -----------------------------------------------------------------------------

    def status(self) -> TrainerStatus:
        """What `andreactl status` shows; read from the control thread, so only plain values.
        Served by global rank 0: `pid` is rank 0's (the process SIGUSR1 checkpoints through), and
        in a job `agent_pid` is torchrun's (the process a stop may be sent to). The start-up's
        status (context.py), with what the collaborators know."""
        ctx, ev = self.ctx, self.evaluation
        started = starting_status(ctx.opts, ctx.platform, ctx.counters, ctx.holds, ctx.progress)
        return started.model_copy(
            update={
                "proxy_connected": self.sink.connected(),
                **self.reporter.progress_status(),
                "compiled": ctx.parts.compiled,
                "eval_every": ev.every,
                "last_eval": ev.last_eval,
            }
        )
