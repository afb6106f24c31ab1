"""The transfer rewards: each arm's measured effect on the held-out loss of a target.

A policy with a `target` (policy.py) names the arms whose held-out loss the run is for. The trainer
then scores a small fixed **probe** of each target arm's held-out data (4 sequences, never trained on:
`daemon/trainer/heldout_loss.py`) every `PROBE_EVERY` steps of the phase, with the weights after the step, and the
step's loss record carries it (`probe`); the bandit reads it in the records' own stream, in step
order and W steps late, like the losses. The target's probe loss is the weighted mean of its arms'.

**Attribution.** The change of the probe loss between two probes is the work of the steps trained
between them; but under AdamW a step's gradient moves the weights over the following steps too, as
the first moment (decay beta1 = 0.9) carries it: a fraction 0.1 at once, 0.09 at the next step, and
so on. So each arm's **exposure** is filtered as the moment filters gradients,
``x_a <- MOMENTUM x_a + (1 - MOMENTUM) [arm of the step = a]``, summed over the steps of the
interval (``X_a``), and the interval's change ``d`` is explained as ``sum_a beta_a X_a``:
``beta_a`` is the change of the target's probe loss per step of arm a. It is estimated by ridge
least squares over the intervals, each weighted by ``FORGET`` to the power of its age (about the
last ``1 / (1 - FORGET)`` intervals): ``beta = (G + RIDGE I)^-1 m`` with ``G = sum X X^T`` and
``m = sum X d``. An arm never trained has no exposure and its beta is 0: no evidence of an effect.

**Mixture.** An arm's gain is ``max(0, -beta_a)``, nats of the target's probe loss per step that
training on it removes. As under gated-learnability, every arm whose gain is at least ``GATE`` of
the best arm's gets one equal share, less in proportion below, none without gain; under a reward
with a ``target_floor`` f (transfer-2: 1), a target arm of weight w keeps at least f * w / w_max of
a share, whatever its measured gain. Why: the target's arms are what the run is for, and their
betas are the least certain (their exposures move together, so the least squares may split their
common effect any way), while an arm the gate lowers loses the exposure that would show its worth
again: under "transfer" (no floor), at batches of 32, a target arm fell to 0.008-0.148 of the
second half on eight runs of twenty (docs/mixing-quality.md). Before
``MIN_INTERVALS`` intervals are known, or when no arm has a gain, the shares are the target's
weights. Exploration: ``eps_t / K`` for each target arm from the first step; a non-target arm none
before ``EXPLORE_AFTER`` steps of the phase (a few early steps on foreign data move the end of an
andrea-tiny run by up to 0.18 nats) and ``eps_t / K`` after. ``w = (1 - sum e) shares + e``, every
weight at least ``MIN_WEIGHT`` (the projection onto the caps and floors needs positive weights; an
arm at it draws about once in 10^12 steps, and a floor still holds).

Pure: the statistics are a function of the records of the phase's steps up to the last incorporated
one (arms and probes), in step order; no clock, no I/O, no random state. float64 throughout; the
solve is numpy's (LAPACK), bit-identical on one machine and software stack, as the bandit's other
arithmetic is (docs/bandit.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from andrea.daemon.mixing.reward import ArmStats, exploration_rate
from andrea.daemon.mixing.rewards import RewardKind, register

#: The first-moment decay of the trainer's AdamW (`optim.beta1`, 0.9 in every preset): how a
#: step's gradient is spread over the updates that follow it.
MOMENTUM = 0.9
#: A probe every this many steps of a phase (the steps s with (s - phase start) % PROBE_EVERY == 0):
#: its cost stays under 5% of a step at andrea-tiny's batch of 8 on a CPU (docs/bandit.md).
PROBE_EVERY = 8
#: Weight kept per interval by each past interval in the least squares (about the last 25
#: intervals, 200 steps).
FORGET = 0.96
#: The ridge of the least squares: an arm with little exposure keeps a beta near 0.
RIDGE = 0.1
#: Intervals known before the betas make the mixture (until then, the target's weights).
MIN_INTERVALS = 3
#: The fraction of the best arm's gain from which an arm gets a full share.
GATE = 0.5
#: Steps of the phase before a non-target arm is explored at all.
EXPLORE_AFTER = 200
#: The least weight of an arm before the projection (which needs positive weights).
MIN_WEIGHT = 1e-12

MEANING = (
    "share of the mixture its measured effect on the target's held-out probe loss earns: equal "
    "for every arm that lowers it at least half as much per step as the best arm, less below"
)


@dataclass
class TransferStats:
    """The transfer reward's statistics of one phase (every arm of the bandit, sorted by name)."""

    arms: list[str]
    exposure: list[float]  # x_a, the moment-filtered exposure after the last incorporated step
    window: list[float]  # X_a, exposure summed since the last probe
    gram: list[list[float]] = field(default_factory=list)  # G, forgetting-weighted
    moment: list[float] = field(default_factory=list)  # m
    last_probe: float | None = None  # the target's probe loss at the last probe
    intervals: int = 0  # intervals between two probes incorporated

    @classmethod
    def fresh(cls, arms: Sequence[str]) -> TransferStats:
        k = len(arms)
        return cls(
            arms=sorted(arms),
            exposure=[0.0] * k,
            window=[0.0] * k,
            gram=[[0.0] * k for _ in range(k)],
            moment=[0.0] * k,
        )


def with_arms(stats: TransferStats, arms: Sequence[str]) -> TransferStats:
    """`stats` over `arms` (sorted): an arm it lacks joins with no exposure and no history (a
    configured arm that a state of the phase did not know); an arm it holds keeps its numbers."""
    names = sorted(set(arms) | set(stats.arms))
    if names == stats.arms:
        return stats
    old = {n: i for i, n in enumerate(stats.arms)}

    def at(row: Sequence[float], n: str) -> float:
        return row[old[n]] if n in old else 0.0

    return TransferStats(
        arms=names,
        exposure=[at(stats.exposure, n) for n in names],
        window=[at(stats.window, n) for n in names],
        gram=[[at(stats.gram[old[a]], b) if a in old else 0.0 for b in names] for a in names],
        moment=[at(stats.moment, n) for n in names],
        last_probe=stats.last_probe,
        intervals=stats.intervals,
    )


def target_probe(probe: Mapping[str, float], target: Mapping[str, float]) -> float | None:
    """The target's probe loss: the weighted mean of its arms' probe losses (weights renormalised
    over the arms the probe holds: an arm without held-out data is never probed). None when the
    probe holds no target arm, or a non-finite loss (an interval is then not closed)."""
    named = [(target[n], probe[n]) for n in sorted(target) if n in probe]
    if not named or not all(math.isfinite(v) for _, v in named):
        return None
    total = math.fsum(w for w, _ in named)
    return math.fsum(w * v for w, v in named) / total


def observe(
    stats: TransferStats,
    arm: str,
    probe: Mapping[str, float] | None,
    target: Mapping[str, float],
) -> None:
    """Fold one step into the statistics: `arm`, trained at it, and the probe its record carries
    (that of the weights after it), if any."""
    for i, name in enumerate(stats.arms):
        x = MOMENTUM * stats.exposure[i] + (1.0 - MOMENTUM) * (1.0 if name == arm else 0.0)
        stats.exposure[i] = x
        stats.window[i] += x
    loss = target_probe(probe, target) if probe else None
    if loss is None:
        return
    if stats.last_probe is not None:
        change = loss - stats.last_probe
        row = stats.window
        for i in range(len(row)):
            stats.moment[i] = FORGET * stats.moment[i] + row[i] * change
            g = stats.gram[i]
            for j in range(len(row)):
                g[j] = FORGET * g[j] + row[i] * row[j]
        stats.intervals += 1
    stats.last_probe = loss
    stats.window = [0.0] * len(stats.window)


def effects(stats: TransferStats, live: Sequence[str]) -> dict[str, float]:
    """beta of each `live` arm: the change of the target's probe loss per step of it (negative:
    it lowers it), by ridge least squares over the live arms' exposures."""
    index = [stats.arms.index(n) for n in live]
    g = np.array([[stats.gram[i][j] for j in index] for i in index], dtype=np.float64)
    m = np.array([stats.moment[i] for i in index], dtype=np.float64)
    beta = np.linalg.solve(g + RIDGE * np.eye(len(index)), m)
    return dict(zip(live, beta.tolist()))


def shares(
    stats: TransferStats, live: Sequence[str], target: Mapping[str, float], floor: float = 0.0
) -> np.ndarray:
    """The gate's share of each live arm (sums to 1): equal for every arm whose gain is at least
    GATE of the best arm's, a target arm at least `floor` times its weight over the heaviest
    target arm's (in full shares); the target's weights before MIN_INTERVALS intervals, or
    without any gain."""
    named = np.array([target.get(n, 0.0) for n in live], dtype=np.float64)
    # No target arm live: every live arm alike, and no arm is a target arm to keep up.
    prior = named if named.sum() > 0.0 else np.ones(len(live))
    if stats.intervals < MIN_INTERVALS:
        return prior / math.fsum(prior)
    gain = np.maximum(0.0, -np.array(list(effects(stats, live).values()), dtype=np.float64))
    top = float(gain.max())
    if top <= 0.0:
        return prior / math.fsum(prior)
    s = np.minimum(1.0, gain / top / GATE)
    if floor > 0.0 and named.sum() > 0.0:
        s = np.maximum(s, floor * named / float(named.max()))
    return s / math.fsum(s)


def weights(
    stats: TransferStats,
    live: Sequence[str],
    target: Mapping[str, float],
    t: int,
    floor: float = 0.0,
) -> np.ndarray:
    """The mixture weights of the live arms after t losses of the phase (sums to 1, each > 0)."""
    k = len(live)
    eps = exploration_rate(k, t) / k
    e = np.array(
        [eps if n in target or t >= EXPLORE_AFTER else 0.0 for n in live], dtype=np.float64
    )
    w = max(0.0, 1.0 - math.fsum(e)) * shares(stats, live, target, floor) + e
    w = np.maximum(w, MIN_WEIGHT)
    return w / math.fsum(w)


@dataclass
class Target:
    """A phase's target, its weights normalised, and the statistics of its probes: what the
    bandit holds under the transfer reward."""

    weights: dict[str, float]
    stats: TransferStats
    #: The reward's `target_floor` (rewards/__init__.py): how far the gate may lower a target arm.
    floor: float = 0.0

    @classmethod
    def of(
        cls,
        target: dict[str, float],
        arms: list[str],
        saved: TransferStats | None,
        floor: float = 0.0,
    ) -> Target:
        """For a phase over `arms` (a state's statistics, `saved`, extended to them)."""
        return cls(target, with_arms(saved or TransferStats.fresh(arms), arms), floor)

    def observe(self, arm: str, probe: Mapping[str, float] | None) -> None:
        observe(self.stats, arm, probe, self.weights)

    def mixture(self, live: Sequence[str], t: int) -> np.ndarray:
        return weights(self.stats, live, self.weights, t, self.floor)

    def rewards(self, arms: Sequence[str], live: Sequence[str]) -> dict[str, float]:
        """Each arm's share under the gate (0 for the arms not `live`)."""
        return {
            **dict.fromkeys(arms, 0.0),
            **dict(zip(live, shares(self.stats, live, self.weights, self.floor).tolist())),
        }

    def probe_arms(self, step: int, phase_start: int, live: Sequence[str]) -> list[str] | None:
        """The live target arms whose probe the record of `step` carries, or None."""
        if not probe_steps(step, phase_start):
            return None
        return sorted(n for n in self.weights if n in live)


def probe_steps(step: int, phase_start: int) -> bool:
    """Whether the record of `step` carries a probe, in a phase that starts after `phase_start`."""
    return step > phase_start and (step - phase_start) % PROBE_EVERY == 0


def _per_arm(*_: object) -> np.ndarray:
    raise TypeError(
        "the transfer reward mixes by the phase's probe statistics (Bandit keeps them), "
        "not by each arm's own"
    )


def _shares(stats: Sequence[ArmStats], pulls: Sequence[int]) -> list[float]:
    return _per_arm(stats, pulls).tolist()


KIND = register(
    RewardKind(
        name="transfer",
        meaning=MEANING,
        statistics=(),
        weights=_per_arm,
        shares=_shares,
        targeted=True,
    )
)
