"""Learning-rate schedule: linear warmup, cosine decay to `min_lr` over `decay_steps`, then flat.

A pure function of the step: nothing to save but the step itself, so the LR of a resumed run is
the LR of the uninterrupted one by construction. Its horizon is `decay_steps`, not `max_steps`,
so extending a run never changes the rates of steps already planned.
"""

from __future__ import annotations

import math

from .checkpoint.manifest import SchedulerState
from .config import OptimConfig


def lr_at(step: int, cfg: OptimConfig) -> float:
    """LR used by optimizer update number `step` (1-based)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.decay_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def scheduler_state(step: int, cfg: OptimConfig) -> SchedulerState:
    return SchedulerState(
        lr=cfg.lr,
        min_lr=cfg.min_lr,
        warmup_steps=cfg.warmup_steps,
        decay_steps=cfg.decay_steps,
        last_step=step,
        last_lr=lr_at(step, cfg),
        next_lr=lr_at(step + 1, cfg),
    )
