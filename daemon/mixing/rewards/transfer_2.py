"""transfer-2: the transfer reward that never lowers a target arm below its weight in the target.

The mixture of `transfer` (rewards/transfer.py, the same statistics and probes) with a
`target_floor` of 1: each target arm keeps at least its weight over the heaviest target arm's, in
full shares of the gate (with equal weights, a full share each), so that the gate's evidence can
add the arms that help the target and raise a lighter target arm, but not starve one. The reward
a policy with a target gets when it names none (policy.py); runs created under "transfer" keep it.
"""

from __future__ import annotations

from andrea.daemon.mixing.rewards import RewardKind, register
from andrea.daemon.mixing.rewards.transfer import KIND as TRANSFER

MEANING = (
    "share of the mixture its measured effect on the target's held-out probe loss earns: equal "
    "for every arm that lowers it at least half as much per step as the best arm, less below; "
    "a target arm never below its weight in the target"
)

KIND = register(
    RewardKind(
        name="transfer-2",
        meaning=MEANING,
        statistics=TRANSFER.statistics,
        weights=TRANSFER.weights,
        shares=TRANSFER.shares,
        targeted=True,
        target_floor=1.0,
    )
)
