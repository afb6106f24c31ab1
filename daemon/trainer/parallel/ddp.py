"""Data parallelism: every rank holds the whole model and Adam state, DistributedDataParallel
averages the gradients, and rank 0's replica is the job's checkpoint."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch

from andrea.daemon.model import GPT
from andrea.daemon.optimizer import AdamW
from andrea.daemon.trainer.parallel.base import OptimizerFactory, Strategy, Wrapped
from andrea.daemon.trainer.platform import distributed as dist

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

    from andrea.daemon.checkpoint.writer import StagingBuffer


class DDP(Strategy):
    """torch's DistributedDataParallel; the replicas are checked before each write."""

    name: ClassVar[str] = "ddp"

    ddp: DistributedDataParallel | None = None

    def wrap(
        self,
        model: GPT,
        optimizer: AdamW,
        restored: bool,
        rebuild: OptimizerFactory,
        finalize_buckets: bool = True,
    ) -> Wrapped:
        """Rank 0's restored moments reach every rank, and DDP wraps the model (it broadcasts
        rank 0's weights as it is built), its buckets settled (`finalize_ddp_buckets`)."""
        from torch.nn.parallel import DistributedDataParallel

        params = [p for _, p in model.named_parameters()]
        if restored:
            states = [optimizer.state[p] for p in params]
            m, v = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
            dist.broadcast_tensors(self.world, m + v)
        self.ddp = DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
        if finalize_buckets:
            finalize_ddp_buckets(self.ddp, model, self.device)
        return Wrapped(self.ddp, params, optimizer)

    def sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """DDP all-reduces (averages) the gradients in the last backward only."""
        if last or self.ddp is None:
            return contextlib.nullcontext()
        return self.ddp.no_sync()

    def gather(
        self,
        params: Sequence[torch.Tensor],
        moments: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
        offsets: Sequence[int],
        staging: StagingBuffer | None,
        step: int,
    ) -> bool:
        """Check that every rank's weights, m and v are rank 0's (DistributedError on every rank
        when they diverged); rank 0's replica is then the job's."""
        m, v = moments
        dist.check_replicas(self.world, {"weights": params, "m": m, "v": v})
        return False


def finalize_ddp_buckets(ddp: torch.nn.Module, model: GPT, device: torch.device) -> None:
    """Give DDP's gradient buckets their final layout before the first step of every life.

    DDP reduces its first iteration in one bucket of every gradient, then rebuilds its buckets in
    the order the gradients became ready (torch's torch/nn/parallel/distributed.py,
    `compute_bucket_size_limits` and `_pre_forward`; the reducer's `rebuild_buckets`). An
    uninterrupted run therefore reduces step k + 1 in the rebuilt layout, and a run resumed at
    step k in the first-iteration one. An element's place in the bucket decides the order in which
    a ring all-reduce (gloo's, NCCL's) sums the ranks' values, and at three ranks or more float
    sums depend on that order: the resume would not be bit-exact. One backward of a tiny dummy
    batch here records the ready order on every life, fresh or resumed, so that the rebuild
    happens at the first forward of both and every step is reduced in the same layout. It changes
    no state: no optimizer step, its gradients are dropped, and the generators are put back."""
    idx = torch.zeros((1, min(8, model.cfg.block_size)), dtype=torch.int64, device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        _, loss = ddp(idx, idx)
        loss.backward()
    for p in model.parameters():
        p.grad = None
