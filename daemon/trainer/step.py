"""One optimizer step: the arithmetic that decides the trajectory, and nothing else.

Everything it reads is either restored from the checkpoint (weights, Adam's state, the cursors,
the RNGs) or a pure function of the step (the learning rate, the arm). Nothing in it checks a
signal to cut a step short: a stop waits for the whole step.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable

import numpy as np
import torch

from andrea.protocol.lossentry import LossEntry

from .. import determinism
from ..config import RunConfig
from ..distributed import World
from ..process import Notifier
from ..schedule import lr_at
from .counters import Counters
from .parts import Parts, Platform


class StepRunner:
    """Trains one step at a time on one rank, advancing `counters.step` and `tokens_seen`."""

    def __init__(
        self,
        cfg: RunConfig,
        world: World,
        platform: Platform,
        parts: Parts,
        counters: Counters,
        stop_requested: Callable[[], bool],
        notifier: Notifier,
        stop_grace: Callable[[], float],
    ) -> None:
        """`stop_grace`: how long stopping takes after the step (the final checkpoint's write),
        asked of systemd on top of the rest of a step that a stop interrupts."""
        self.cfg = cfg
        self.world = world
        self.platform = platform
        self.parts = parts
        self.counters = counters
        self.stop_requested = stop_requested
        self.notifier = notifier
        self.stop_grace = stop_grace

    def train(self, arm: int) -> tuple[float, LossEntry | None]:
        """`grad_accum` micro-batches of the step's arm, their gradients averaged, each on this
        rank's share of the micro-batch's global batch. Returns this rank's loss (the mean over
        its micro-batches) and on rank 0 the step's record (whose loss the loop replaces by the
        mean over ranks)."""
        step = self.counters.step + 1
        accum, optimizer = self.cfg.grad_accum, self.parts.optimizer
        lr = lr_at(step, self.cfg.optim)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        sha = hashlib.sha256()
        losses = []
        n_tokens = 0
        started = time.perf_counter()
        extended = False
        for i in range(accum):
            if i and not extended and self.stop_requested():
                # A stop waits for the whole step: ask systemd for the rest of it (at the pace
                # of the micro-batches so far, doubled) on top of the final checkpoint's time.
                extended = True
                per_micro = (time.perf_counter() - started) / i
                self.notifier.extend_timeout(2 * per_micro * (accum - i) + self.stop_grace())
            # Every rank draws the whole global batch's chunks (only indices and a gather of
            # tokens), so the cursors advance alike everywhere and the digest names the global
            # batch; each rank trains on its own contiguous rows of it.
            batch = self.parts.streams[arm].next_batch(self.parts.micro_batch)
            sha.update(batch.tobytes())
            losses.append(self._micro_batch(batch, last=i == accum - 1))
            n_tokens += batch.shape[0] * (batch.shape[1] - 1)
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(
                self.parts.params, self.cfg.optim.grad_clip, foreach=True
            )
        optimizer.step()
        self.counters.step = step
        self.counters.tokens_seen += n_tokens
        value = (losses[0] if accum == 1 else torch.stack(losses).mean()).item()
        if not self.world.is_main:
            return value, None
        return value, self._record(step, value, arm, lr, n_tokens, sha.hexdigest())

    def _micro_batch(self, batch: np.ndarray, last: bool) -> torch.Tensor:
        """Forward and backward on this rank's rows of `batch`; its loss, detached."""
        r, rows, accum = self.world.rank, self.parts.local_batch, self.cfg.grad_accum
        device, forward = self.platform.device, self.parts.forward
        xy = torch.from_numpy(batch[r * rows : (r + 1) * rows]).to(device, non_blocking=True)
        # In a job, DDP all-reduces (averages) the gradients in the last backward only.
        sync = contextlib.nullcontext() if last or not self.world.distributed else forward.no_sync()
        with sync:
            with (
                self.platform.numerics.autocast(device),
                determinism.attention(self.platform.deterministic, device),
            ):
                _, loss = forward(xy[:, :-1], xy[:, 1:])
            # The mean over micro-batches of equal size is the loss of the step's batch.
            (loss / accum if accum > 1 else loss).backward()
        return loss.detach()

    def _record(
        self, step: int, loss: float, arm: int, lr: float, tokens: int, digest: str
    ) -> LossEntry:
        c = self.counters
        return LossEntry(
            step=step,
            loss=loss,
            arm=self.parts.arms[arm].name,
            lr=lr,
            tokens=tokens,
            wall_time=time.time(),
            segment=c.segment,
            phase=c.phase,
            batch_sha256=digest,
        )
