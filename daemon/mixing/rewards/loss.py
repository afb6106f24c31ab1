"""The loss reward (ODM, Albalak et al. 2023): each arm's EMA of exp(training loss), a softmax of
it; what a policy without a `reward` key means (reward.py, **loss**)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.reward import ArmStats
from andrea.daemon.mixing.rewards import RewardKind, register


def weights(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
) -> np.ndarray:
    """w = (1 - K eps_t) softmax(eps_{t-1} R) + eps_t; the initial weights before any loss."""
    if t == 0:
        return reward.initial_mixture(initial)
    return reward.mixture_weights(np.array([s.ema_reward for s in stats], dtype=np.float64), t)


def shares(stats: Sequence[ArmStats], pulls: Sequence[int]) -> list[float]:
    """R_i itself."""
    return [s.ema_reward for s in stats]


KIND = register(
    RewardKind(
        name="loss",
        meaning="EMA of exp(training loss) per arm (ODM): rewards difficulty",
        statistics=("ema_reward",),
        weights=weights,
        shares=shares,
        reads_progress=False,
    )
)
