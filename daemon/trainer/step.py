"""One optimizer step: the arithmetic that decides the trajectory, and nothing else.

Everything it reads is either restored from the checkpoint (weights, Adam's state, the cursors,
the RNGs) or a pure function of the step (the learning rate, the arm). Nothing in it checks a
signal to cut a step short: a stop waits for the whole step.

A step returns without reading its loss back (`TrainedStep`): on a GPU its kernels are only queued,
and reading the loss would make the host wait for them before it could queue the next step. The
loop reads it one step late, or at once where the step boundary needs it (loop.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from andrea.daemon.data.livefiles import TokensChanged
from andrea.daemon.trainer.batch_loader import Batches, StepBatches
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.platform import determinism
from andrea.daemon.trainer.schedule import lr_at
from andrea.protocol.lossentry import LossEntry


class Mark:
    """A point in a step's work: a CUDA event on a GPU (its time is known once the device has
    passed it), the host's clock on CPU (where the work is done when the call returns)."""

    def __init__(self, device: torch.device) -> None:
        self.event = None
        self.clock = time.perf_counter()
        if device.type == "cuda":
            self.event = torch.cuda.Event(enable_timing=True)
            self.event.record()

    def seconds_after(self, earlier: Mark) -> float:
        """Seconds from `earlier` to this mark (on a GPU, waits until the device passes it)."""
        if self.event is None or earlier.event is None:
            return self.clock - earlier.clock
        self.event.synchronize()
        return earlier.event.elapsed_time(self.event) / 1000


@dataclass
class TrainedStep:
    """A step trained on this rank (on a GPU: its kernels queued), its loss not read yet."""

    step: int
    #: This rank's loss: the mean over its micro-batches, on the device.
    loss: torch.Tensor
    batches: StepBatches
    #: Where the step's work started and ended (its duration, on the device).
    start: Mark
    end: Mark
    arm: str
    lr: float
    tokens: int
    segment: int
    phase: int
    #: The target's probe losses of the weights after this step, when its assignment asked.
    probe: dict[str, float] | None = None
    _value: float | None = field(default=None, repr=False)

    def seconds(self) -> float:
        """How long the step's work took (on a GPU, once it is done)."""
        return self.end.seconds_after(self.start)

    def value(self) -> float:
        """This rank's loss (waits for the step's kernels on a GPU, once)."""
        if self._value is None:
            self._value = self.loss.item()
        return self._value

    def entry(self, loss: float, heldout: dict[str, float] | None = None) -> LossEntry:
        """The step's record, with `loss` (this rank's, or the job's mean) and the held-out
        losses of the weights it started from, when they were evaluated."""
        return LossEntry(
            step=self.step,
            loss=loss,
            arm=self.arm,
            lr=self.lr,
            tokens=self.tokens,
            wall_time=time.time(),
            segment=self.segment,
            phase=self.phase,
            batch_sha256=self.batches.digest(),
            heldout=heldout,
            probe=self.probe,
        )


class StepRunner:
    """Trains one step at a time on one rank, advancing `counters.step` and `tokens_seen`."""

    def __init__(
        self,
        ctx: TrainerContext,
        stop_grace: Callable[[], float],
        before_update: Callable[[], None] = lambda: None,
    ) -> None:
        """`stop_grace`: how long stopping takes after the step (the final checkpoint's write),
        asked of systemd on top of the rest of a step that a stop interrupts. `before_update`:
        what must happen before the optimizer writes the weights and moments (a checkpoint's copy
        of them still in flight is waited for, on the device)."""
        self.ctx = ctx
        self.stop_grace = stop_grace
        self.before_update = before_update
        # parts.micro_batch: the sequences of one micro-batch over the whole job; each rank trains
        # parts.local_batch rows of it.
        parts, device = ctx.parts, ctx.platform.device
        self.batches = Batches(parts, ctx.world, device, parts.micro_batch, ctx.cfg.grad_accum)

    def train(self, arm: int) -> TrainedStep:
        """`grad_accum` micro-batches of the step's arm, their gradients averaged, each on this
        rank's share of the micro-batch's global batch; then the optimizer's update.
        TokensChanged, before anything of the step is done, when its tokens cannot be read as
        the run opened them."""
        start = Mark(self.ctx.platform.device)
        step = self.ctx.counters.step + 1
        accum, optimizer = self.ctx.cfg.grad_accum, self.ctx.parts.optimizer
        lr = lr_at(step, self.ctx.cfg.optim)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad()
        # Every rank draws the whole global batch's chunks, so the cursors advance alike
        # everywhere and the digest names the global batch.
        stream = self.ctx.parts.streams[arm]
        cursor = stream.epoch, stream.position
        batches = self.batches.draw(arm)
        try:
            batches.wait()
        except TokensChanged:
            # Nothing of the step happened: the checkpoint of the step before is exact.
            stream.epoch, stream.position = cursor
            raise
        if step < self.ctx.cfg.max_steps:
            self.batches.prefetch(self._next_arm(step + 1))
        losses = self._micro_batches(batches)
        if self.ctx.cfg.optim.grad_clip > 0:
            self.ctx.parts.parallel.clip(self.ctx.parts.params, self.ctx.cfg.optim.grad_clip)
        self.before_update()
        optimizer.step()
        c = self.ctx.counters
        c.step = step
        tokens = accum * self.ctx.parts.micro_batch * self.ctx.cfg.model.block_size
        c.tokens_seen += tokens
        return TrainedStep(
            step=step,
            loss=losses[0] if accum == 1 else torch.stack(losses).mean(),
            batches=batches,
            start=start,
            end=Mark(self.ctx.platform.device),
            arm=self.ctx.parts.arms[arm].name,
            lr=lr,
            tokens=tokens,
            segment=c.segment,
            phase=c.phase,
        )

    def close(self) -> None:
        """Stop the batch worker."""
        self.batches.close()

    def _next_arm(self, step: int) -> int | None:
        # The fixed mixture's arm is a pure function of the step; the proxy's is known only
        # once it is assigned.
        return self.ctx.parts.mixture.assign(step) if self.ctx.cfg.mixing == "fixed" else None

    def _micro_batches(self, batches: StepBatches) -> list[torch.Tensor]:
        accum = self.ctx.cfg.grad_accum
        losses = []
        started = time.perf_counter()
        extended = False
        for i in range(accum):
            if i and not extended and self.ctx.flags.stop_requested():
                # A stop waits for the whole step: ask systemd for the rest of it (at the pace
                # of the micro-batches so far, doubled) on top of the final checkpoint's time.
                extended = True
                per_micro = (time.perf_counter() - started) / i
                self.ctx.notifier.extend_timeout(2 * per_micro * (accum - i) + self.stop_grace())
            losses.append(self._micro_batch(batches.micro(i), last=i == accum - 1))
        return losses

    def _micro_batch(self, xy: torch.Tensor, last: bool) -> torch.Tensor:
        """Forward and backward on this rank's rows; its loss, detached."""
        accum, device, forward = (
            self.ctx.cfg.grad_accum,
            self.ctx.platform.device,
            self.ctx.parts.forward,
        )
        # In a job, the gradients are reduced over the ranks in the last backward only.
        with self.ctx.parts.parallel.sync(last):
            with (
                self.ctx.platform.numerics.autocast(device),
                determinism.attention(self.ctx.platform.deterministic, device),
            ):
                _, loss = forward(xy[:, :-1], xy[:, 1:])
            # The mean over micro-batches of equal size is the loss of the step's batch.
            (loss / accum if accum > 1 else loss).backward()
        return loss.detach()
