"""What a parallelism strategy owns, and the trivial one: a process that trains alone.

A strategy decides how the ranks of a job share the model. It owns the four things that depend on
it, and nothing else: wrapping the model (and the optimizer, when wrapping replaces the
parameters), skipping the gradient sync on the micro-batches of a step but its last, clipping the
gradients, and the model and optimizer state of a checkpoint — gathered for rank 0 to write, and
restored from rank 0's read. Everything else (the per-step agreement, the data split, the per-rank
RNG and cursor states, the `.bin` and its manifest) is the same whatever the strategy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from andrea.daemon.checkpoint.manifest import Sharding
from andrea.daemon.model import GPT
from andrea.daemon.optimizer import AdamW
from andrea.daemon.trainer.platform.precision import NumericMode
from andrea.daemon.trainer.platform.world import World

if TYPE_CHECKING:  # a checkpoint's host buffer: rank 0's, passed in at a checkpoint
    from andrea.daemon.checkpoint.writer import StagingBuffer

#: Builds the run's optimizer over a model's parameters (after a wrap that replaced them).
OptimizerFactory = Callable[[GPT], AdamW]


@dataclass(frozen=True)
class Wrapped:
    """What a step trains with once the strategy wrapped the model."""

    #: What a step calls: the model, or its wrapper.
    forward: torch.nn.Module
    #: The parameters the optimizer updates, in the checkpoint layout's order.
    params: list[torch.nn.Parameter]
    optimizer: AdamW


class Strategy:
    """One process alone: nothing to wrap, to sync or to gather. The base of the others."""

    #: The name of `[distributed] strategy` (a single process records none).
    name: ClassVar[str] = "single"
    #: What the manifest's `environment.sharding` records: a resume that changes it is inexact.
    sharding: ClassVar[Sharding] = "replicated"
    #: Every rank must run every forward pass together (its weights are gathered by a
    #: collective): held-out evaluation and samples run on every rank, not on rank 0 alone.
    joint_forward: ClassVar[bool] = False

    def __init__(self, world: World, device: torch.device, numerics: NumericMode) -> None:
        self.world = world
        self.device = device
        self.numerics = numerics

    def wrap(
        self,
        model: GPT,
        optimizer: AdamW,
        restored: bool,
        rebuild: OptimizerFactory,
        finalize_buckets: bool = True,
    ) -> Wrapped:
        """Wrap the model for training, once, after the resume restored rank 0's state
        (`restored`: Adam's moments came from a checkpoint, on rank 0; the others hold zeros of
        their shape). `rebuild` makes the optimizer again where the wrap replaces the
        parameters; `finalize_buckets` False only for DDP's negative control."""
        return Wrapped(model, [p for _, p in model.named_parameters()], optimizer)

    def sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """The context of a micro-batch's backward pass: the gradients are reduced over the
        ranks in the `last` one only."""
        return contextlib.nullcontext()

    def clip(self, params: Sequence[torch.Tensor], max_norm: float) -> None:
        """Clip the gradients to a total norm of `max_norm` (over the whole model, every rank
        alike)."""
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)

    def gather(
        self,
        params: Sequence[torch.Tensor],
        moments: tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]],
        offsets: Sequence[int],
        staging: StagingBuffer | None,
        step: int,
    ) -> bool:
        """Every rank, at an agreed checkpoint point: the model and optimizer state for rank 0
        to write (`staging`: rank 0's host buffer, None elsewhere; `offsets`: each parameter's
        place in the payload). True when it staged the weights, m and v itself; False when rank
        0's own tensors are the job's (rank 0 then copies them, `StagingBuffer.fill`)."""
        return False

    def weights_finite(self, params: Sequence[torch.Tensor]) -> bool:
        """Rank 0, before a write, after `gather`: whether every weight of the job is finite."""
        return bool(torch.stack([p.isfinite().all() for p in params]).all())
