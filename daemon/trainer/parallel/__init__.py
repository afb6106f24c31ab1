"""How the ranks of a job share the model: one strategy per `[distributed] strategy`.

- base.py: the seam (`Strategy`: wrap, sync, clip, gather and restore the state) and a single
  process's trivial strategy;
- ddp.py: DistributedDataParallel, every rank a replica;
- fsdp.py: FSDP2, parameters, gradients and Adam's moments sharded over the ranks.
"""

from __future__ import annotations

import torch

from andrea.daemon.trainer.parallel.base import Strategy, Wrapped
from andrea.daemon.trainer.parallel.ddp import DDP
from andrea.daemon.trainer.parallel.fsdp import FSDP
from andrea.daemon.trainer.platform.precision import NumericMode
from andrea.daemon.trainer.platform.world import World

#: `[distributed] strategy` → its class.
STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (DDP, FSDP)}

__all__ = ["STRATEGIES", "Strategy", "Wrapped", "strategy_for"]


def strategy_for(name: str, world: World, device: torch.device, numerics: NumericMode) -> Strategy:
    """The strategy `name` for a job; a single process's trivial one for a world of one (the
    config's strategy then changes nothing)."""
    if not world.distributed:
        return Strategy(world, device, numerics)
    return STRATEGIES[name](world, device, numerics)  # the config admits these names only
