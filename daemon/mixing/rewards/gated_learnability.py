"""The gated-learnability reward: an equal share for every arm whose progress is at least half the
best arm's, less below (reward.py, **gated-learnability**)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.reward import ArmStats
from andrea.daemon.mixing.rewards import RewardKind, register
from andrea.daemon.mixing.rewards.learnability import STATISTICS


def weights(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
) -> np.ndarray:
    """w = (1 - eps_t) shares + eps_t / K; the initial weights before any loss."""
    if t == 0:
        return reward.initial_mixture(initial)
    return reward.gated_weights([s.progress for s in stats], list(pulls), t)


def shares(stats: Sequence[ArmStats], pulls: Sequence[int]) -> list[float]:
    """min(1, r_i / GATE) normalised."""
    return reward.gated_shares([s.progress for s in stats], list(pulls)).tolist()


KIND = register(
    RewardKind(
        name="gated-learnability",
        meaning="share of the mixture its recent progress earns: equal for every arm "
        "whose loss EMA still sets new lows at least half as fast as the best arm's, less below",
        statistics=STATISTICS,
        weights=weights,
        shares=shares,
    )
)
