"""The gated-heldout reward: gated-learnability-2, and a least share for a learnt arm whose
held-out loss rises (reward.py, **gated-heldout**)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.reward import ArmStats
from andrea.daemon.mixing.rewards import RewardKind, register
from andrea.daemon.mixing.rewards import gated_learnability_2 as gated2

#: What it reads of the held-out evaluations; states written before it lack them, so the restart
#: replay compares them only under this reward.
HELDOUT_STATISTICS = ("first_loss", "heldout", "heldout_low", "heldout_evals", "forgotten")


def weights(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
) -> np.ndarray:
    """gated-learnability-2's weights, then at least FORGETTING_SHARE / K for every learnt arm
    being forgotten."""
    return reward.heldout_weights(
        list(stats), list(pulls), list(pending), t, list(initial) if t == 0 else None
    )


KIND = register(
    RewardKind(
        name="gated-heldout",
        meaning="as gated-learnability-2, and at least an eighth of a uniform share for an "
        "arm it has learnt while its held-out loss rises (being forgotten)",
        statistics=(*gated2.KIND.statistics, *HELDOUT_STATISTICS),
        weights=weights,
        shares=gated2.shares,
        counts_pending=True,
        replayed=HELDOUT_STATISTICS,
    )
)
