"""The learnability reward: the mixture proportional to each arm's recent progress, the nats per
step by which its loss EMA still sets new lows (reward.py, **learnability**)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.reward import ArmStats
from andrea.daemon.mixing.rewards import RewardKind, register

STATISTICS = ("loss_ema", "loss_best", "progress_sum", "progress_pulls", "last_pull")


def weights(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
) -> np.ndarray:
    """w = (1 - K eps_t) shares + eps_t; the initial weights before any loss."""
    if t == 0:
        return reward.initial_mixture(initial)
    return reward.learnability_weights([s.progress for s in stats], list(pulls), t)


def shares(stats: Sequence[ArmStats], pulls: Sequence[int]) -> list[float]:
    """Each arm's share of the recent progress."""
    return reward.progress_shares([s.progress for s in stats], list(pulls)).tolist()


KIND = register(
    RewardKind(
        name="learnability",
        meaning="share of the recent progress (nats per step by which each arm's loss EMA "
        "still sets new lows)",
        statistics=STATISTICS,
        weights=weights,
        shares=shares,
    )
)
