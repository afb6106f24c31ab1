"""Learning-rate schedule: linear warmup, cosine decay to `min_lr` over `decay_steps`, then flat.

A pure function of the step: nothing to save but the step itself, so the LR of a resumed run is
the LR of the uninterrupted one by construction. Its horizon is `decay_steps`, not `max_steps`,
so extending a run never changes the rates of steps already planned.
"""

from __future__ import annotations

import math

from andrea.daemon.checkpoint.manifest import SchedulerState
from andrea.daemon.config import OptimConfig


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


def describe(cfg: OptimConfig) -> str:
    """The schedule in one line, for the start-up log."""
    return (
        f"LR schedule: linear warmup to {cfg.lr:.3g} over {cfg.warmup_steps:,} steps, cosine decay "
        f"to {cfg.min_lr:.3g} at step {cfg.decay_steps:,} (optim.decay_steps), then flat"
    )


def disagreement(cfg: OptimConfig, max_steps: int) -> str | None:
    """Why `max_steps` and the schedule disagree, or None when the decay ends with the run."""
    if max_steps > cfg.decay_steps:
        return (
            f"max_steps {max_steps:,} runs past the end of the LR decay at step {cfg.decay_steps:,}: "
            f"the last {max_steps - cfg.decay_steps:,} steps train at the minimum LR {cfg.min_lr:.3g}. "
            f"To decay over the whole run, start it with --decay-steps {max_steps} (a new run; an "
            "existing one needs --allow-config-change, which changes the LR of the steps to come)"
        )
    if max_steps < cfg.decay_steps:
        # A decay cannot end before the warmup does (OptimConfig refuses it).
        advice = (
            f"set --decay-steps {max_steps}"
            if max_steps >= cfg.warmup_steps
            else f"set --decay-steps {cfg.warmup_steps} (its warmup's {cfg.warmup_steps} steps)"
        )
        return (
            f"max_steps {max_steps:,} ends the run before the LR decay does (step {cfg.decay_steps:,}): "
            f"the last step trains at LR {lr_at(max_steps, cfg):.3g}, not the minimum "
            f"{cfg.min_lr:.3g}; fine if the run will be extended, else {advice}"
        )
    return None
