"""The rewards a policy can choose, one module each, found by name.

Each module of this package describes one reward as a `RewardKind` and registers it
(`register`) when it is imported; this package imports every module it holds, so a reward is added
by adding its module and nothing else (docs/extending.md, "Add a reward"). The bandit, the policy,
the state's checks and the restart replay read what they need of a reward from its `RewardKind`:

- `name`: what `reward = "..."` in policy.toml says, recorded in every state and pivot archive;
- `meaning`: what it measures, in a few words, for `status`;
- `statistics`: the `ArmStats` fields (reward.py) its mixture reads;
- `weights`: the mixture weights of the live arms, and `shares`: each arm's reward for people;
- `counts_pending`: whether the draw of a step counts the steps assigned and not yet reported;
- `reads_progress`: whether its mixture is made of the loss EMA's statistics (a state under it must
  carry them for every arm trained);
- `replayed`: the statistics, beyond `HISTORY` (kept under every reward), that the restart replay
  compares with `.state.json` (startup.py);
- `targeted`: whether it serves a policy's `target` (the transfer rewards): its statistics are the
  phase's, not an arm's (rewards/transfer.py), and the bandit keeps them in the state;
- `target_floor`: under a targeted reward, the least share of a target arm, in full shares of the
  gate, scaled by the arm's weight in the target (rewards/transfer.py);
- `observe`: a reward's own statistics of an arm, folded in at each of its losses after the ones
  every reward keeps (gated-plateau's recent losses and plateau call).

A reward must be a pure function of the records up to s - W: no clock, no I/O, no global random
state (docs/bandit.md, "Determinism and the lag W").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np

from andrea.daemon.mixing.reward import ArmStats

#: The statistics of an arm's history that every reward keeps (for status, whichever reward mixes)
#: and that the restart replay always compares with the state file, with the arm's identity and
#: steps.
HISTORY: tuple[str, ...] = (
    "ema_reward",
    "loss_ema",
    "loss_best",
    "progress_sum",
    "progress_pulls",
    "last_pull",
    "fruitless",
)

#: weights(stats, pulls, pending, t, initial): the mixture weights of the live arms (sums to 1).
#: `pending`: each arm's steps assigned whose losses are not known yet; `t`: the losses
#: incorporated in the phase; `initial`: the policy's initial weights (the mixture before any loss).
Weights = Callable[
    [Sequence[ArmStats], Sequence[int], Sequence[int], int, Sequence[float]], np.ndarray
]
#: shares(stats, pulls): each live arm's reward as status shows it.
Shares = Callable[[Sequence[ArmStats], Sequence[int]], list[float]]
#: observe(stats, step, loss): fold the arm's loss of `step` into the reward's own statistics.
Observe = Callable[[ArmStats, int, float], None]


class UnknownReward(ValueError):
    """A reward name no module of this package registers."""


@dataclass(frozen=True)
class RewardKind:
    """One reward: what it is called and means, what it reads, how it mixes."""

    name: str
    meaning: str
    statistics: tuple[str, ...]
    weights: Weights
    shares: Shares
    counts_pending: bool = False
    reads_progress: bool = True
    replayed: tuple[str, ...] = ()
    #: Whether it mixes by a policy's `target` (the transfer rewards): the bandit then keeps the
    #: phase's probe statistics (rewards/transfer.py) and mixes with them, not with `weights`.
    targeted: bool = False
    #: Under a targeted reward: how far the gate may lower a target arm (rewards/transfer.py).
    target_floor: float = 0.0
    #: The reward's own statistics of an arm, folded in at each of its losses after the shared
    #: ones (reward.observe); None: it keeps none.
    observe: Observe | None = None

    def __post_init__(self) -> None:
        known = {f.name for f in fields(ArmStats)}
        unknown = sorted(set(self.statistics) - known) + sorted(set(self.replayed) - known)
        if unknown:
            raise ValueError(f"reward {self.name!r}: no such arm statistics: {unknown}")
        if not 0.0 <= self.target_floor <= 1.0 or (self.target_floor and not self.targeted):
            raise ValueError(
                f"reward {self.name!r}: target_floor {self.target_floor} needs a targeted reward "
                "and a value in [0, 1]"
            )


_REGISTRY: dict[str, RewardKind] = {}


def register(kind: RewardKind) -> RewardKind:
    """Make `kind` choosable by its name; a name already taken is refused (a run's reward must mean
    one thing)."""
    if kind.name in _REGISTRY:
        raise ValueError(f"reward {kind.name!r} is registered twice")
    _REGISTRY[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget a reward registered at run time (a test's own)."""
    _REGISTRY.pop(name, None)


def lookup(name: str) -> RewardKind:
    """The reward called `name`; raises `UnknownReward` listing the rewards there are."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownReward(
            f"unknown reward {name!r} (the rewards: {', '.join(names())})"
        ) from None


def names() -> tuple[str, ...]:
    """Every registered reward's name, sorted."""
    return tuple(sorted(_REGISTRY))


def _load_all() -> None:
    # Sorted: the registry's order may not depend on the file system's.
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")


_load_all()
