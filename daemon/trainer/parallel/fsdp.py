"""Sharded data parallelism: FSDP2 (`torch.distributed.fsdp.fully_shard`). Each rank holds 1/N of
the weights, gradients and Adam's moments; a block's weights are all-gathered for its forward and
backward passes and freed after, and the gradients are reduce-scattered.

- **Wrapping.** `fully_shard` on every transformer block, then on the root (the embeddings, the
  final norm and the head). Every parameter becomes a DTensor sharded on its first dimension over
  the ranks; a first dimension that does not divide (a vocabulary of 50,257 at 2 ranks, or 257 at
  3) gives uneven shards, which the gather and the restore take as they come. Blocks reshard after
  their forward pass (`reshard_after_forward=True`, ZeRO-3): the memory per rank is the shards
  plus one gathered block (two while the next one is prefetched), at the price of a second
  all-gather of each block in the backward pass; the root keeps FSDP's own choice (not resharded
  after forward: the backward pass starts with it). On CUDA the compute runs in the precision's
  autocast dtype (bf16 parameters in the forward and backward passes), gradients are reduced in
  fp32 and the sharded master weights, gradients and moments stay fp32, which is what the `.bin`
  holds (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`).
- **The checkpoint.** The `.bin` of a DDP run, the same n and layout: every rank takes part in
  one all-gather per array (a DTensor's full_tensor), parameter by parameter in the file's order,
  weights then m then v, and rank 0 copies each into its staging buffer before the next: rank 0's
  memory beyond the staging buffer (the `12 n + 8` bytes a DDP run stages too) is one gathered
  parameter and the collective's buffer of it (measured: docs/performance.md), and so is every
  other rank's.
- **The restore.** Rank 0 reads the `.bin` (the resume's own code, as under DDP) into the model
  before it is sharded; its weights reach every rank by broadcast, parameter by parameter, before
  `fully_shard` keeps each rank's shard; Adam's moments are scattered from rank 0 into shards
  (`distribute_tensor(..., src_data_rank=0)`) one parameter at a time. A job on several machines
  needs the file on rank 0's only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, cast

import torch

from andrea.daemon.checkpoint.manifest import Sharding
from andrea.daemon.model import GPT
from andrea.daemon.optimizer import AdamW
from andrea.daemon.trainer.parallel.base import OptimizerFactory, Strategy, Wrapped
from andrea.daemon.trainer.platform import distributed as dist

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

    from andrea.daemon.checkpoint.writer import StagingBuffer


class FSDP(Strategy):
    """FSDP2 per transformer block, then the root; the `.bin` gathered parameter by parameter."""

    name: ClassVar[str] = "fsdp"
    sharding: ClassVar[Sharding] = "fsdp"
    joint_forward: ClassVar[bool] = True

    root: FSDPModule | None = None
    #: Whether every weight gathered at the last checkpoint point was finite (rank 0's view).
    _finite = True

    def policy(self) -> MixedPrecisionPolicy:
        """bf16 (the precision's autocast dtype) parameters for compute on CUDA, fp32 reductions;
        no cast elsewhere (a CPU job computes as a single process does)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = self.numerics.autocast_dtype
        if self.device.type != "cuda" or dtype is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)

    def wrap(
        self,
        model: GPT,
        optimizer: AdamW,
        restored: bool,
        rebuild: OptimizerFactory,
        finalize_buckets: bool = True,
    ) -> Wrapped:
        """Rank 0's weights to every rank, the model sharded, the optimizer rebuilt over the
        shards and, after a resume, rank 0's moments scattered into them."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        plain = [p for _, p in model.named_parameters()]
        moments = [optimizer.state[p] for p in plain] if restored else []
        dist.broadcast_tensors(self.world, [p.detach() for p in plain])
        mesh = init_device_mesh(self.device.type, (self.world.size,))
        mp = self.policy()
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True, mp_policy=mp)
        self.root = fully_shard(model, mesh=mesh, mp_policy=mp)
        sharded = rebuild(model)
        params = [p for _, p in model.named_parameters()]
        for p, state in zip(params, moments, strict=False):
            sharded.state[p] = {
                "step": state["step"].clone(),
                "exp_avg": _scatter(state["exp_avg"], p),
                "exp_avg_sq": _scatter(state["exp_avg_sq"], p),
            }
            state.clear()  # the whole moments of this parameter are not needed any more
        return Wrapped(model, params, sharded)

    def sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """The reduce-scatter of the gradients in the last micro-batch's backward only; the
        others accumulate unsharded gradients on each rank."""
        return self._sync(last)

    @contextlib.contextmanager
    def _sync(self, last: bool) -> Iterator[None]:
        if self.root is not None:
            self.root.set_requires_gradient_sync(last)
        yield

    def gather(
        self,
        params: Sequence[torch.Tensor],
        moments: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
        offsets: Sequence[int],
        staging: StagingBuffer | None,
        step: int,
    ) -> bool:
        """Stream the whole state to rank 0's buffer, one all-gather per array in the file's
        order (each rank holds one gathered array at a time)."""
        if staging is not None:
            staging.begin(step)
        finite = True
        for part, arrays in enumerate((params, *moments)):
            for tensor, offset in zip(arrays, offsets, strict=True):
                full = cast("DTensor", tensor.detach()).full_tensor()
                if staging is not None:
                    if part == 0:
                        finite = finite and bool(full.isfinite().all())
                    staging.put(part, offset, full)
                del full
        self._finite = finite
        return True

    def weights_finite(self, params: Sequence[torch.Tensor]) -> bool:
        """What rank 0 saw of the weights as it gathered them (`gather` runs first)."""
        return self._finite


def _scatter(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Rank 0's `full` tensor as a DTensor sharded as `like` (each rank receives its shard)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    spec = cast(DTensor, like)
    return distribute_tensor(full.detach(), spec.device_mesh, spec.placements, src_data_rank=0)
