"""The gated-learnability-2 reward: the gate, each arm measured first (its draw counts the steps
pending) and explored less as its steps bring nothing (reward.py, **gated-learnability-2**)."""

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
    """w_i = (1 - sum_j e_j) shares_i + e_i, e_i = eps_t / (K (1 + f_i))."""
    return reward.measuring_weights(
        [s.progress for s in stats],
        list(pulls),
        list(pending),
        [s.fruitless for s in stats],
        t,
        list(initial) if t == 0 else None,
    )


def shares(stats: Sequence[ArmStats], pulls: Sequence[int]) -> list[float]:
    """The gate's shares, nothing pending."""
    progress = [s.progress for s in stats]
    return reward.measuring_shares(progress, list(pulls), [0] * len(stats)).tolist()


KIND = register(
    RewardKind(
        name="gated-learnability-2",
        meaning="share of the mixture its recent progress earns: equal for every arm "
        "whose loss EMA still sets new lows at least half as fast as the best arm's, less below; an "
        "arm not measured yet gets the 2 steps its measurement needs, then waits for their losses",
        statistics=(*STATISTICS, "fruitless"),
        weights=weights,
        shares=shares,
        counts_pending=True,
    )
)
