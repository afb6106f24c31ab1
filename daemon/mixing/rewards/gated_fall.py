"""The gated-fall reward (the default of new runs until gated-plateau): a uniform mixture over the
arms whose fall is not over, an arm leaving it only on clear evidence, and coming back as soon as it
is forgotten.

Per measured arm (its statistics: reward.py):

- *unlearnable*: its progress (``rho_i``, its loss EMA's new lows per step) is at most
  ``UNLEARNABLE`` of the median measured arm's: random bytes, whose loss never sets a new low;
- *plateaued*: its fall is ``FALL`` (98%) behind it. Its fall so far is ``first_loss - loss_best``;
  what is left of it is estimated as ``fall_rate * HORIZON * n``, its recent drop per step
  (``fall_rate``: its new lows' drops, an EMA over about the last 15% of its steps and at least its
  last 5, so that its early fall stops counting soon, while a slow arm's new lows, which come in
  bursts, average out) carried on over a tenth as many steps again as it has had (``n``). On the
  synthetic learners of tests/support/bandit.py this sees the letters' plateau 116 to 130 steps
  after it; a text arm's noisy late curve can look flat for a while, which the rules below bound;
- *being forgotten*: learnt, and its held-out loss rose at the newest evaluation
  (``observe_heldout``): it is needed again, whatever the two above say.

Each arm neither unlearnable nor plateaued, or being forgotten, gets one equal share; the others get
only exploration, ``e_i = eps_t / (K (1 + f_i))`` (gated-learnability-2's, ``f_i`` its steps since a
new low). Arms are measured first as under gated-learnability-2 (the draw counts the steps pending).

Why uniform and not a gate on progress: without a target, the bandit cannot tell an arm that still
learns but teaches the others nothing (generated text, logs, boilerplate) from one that helps them;
the gate gave such an arm, learning faster than the others, 0.29 of the second half (case e of
docs/mixing-quality.md) and up to 0.55 on harsher members of the class, while the others' held-out
losses rose. Here no arm ever gets more than an arm still learning, so that arm cannot take more than
its uniform share. When the evidence is unclear the mixture is uniform: when most learnable arms
look plateaued (late in a run the LR's decay flattens every curve), no plateau counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.reward import MEASURE_PULLS, ArmStats
from andrea.daemon.mixing.rewards import RewardKind, register
from andrea.daemon.mixing.rewards.gated_heldout import HELDOUT_STATISTICS
from andrea.daemon.mixing.rewards.learnability import STATISTICS

#: An arm is plateaued once this fraction of its fall is behind it (the benchmark's --plateau-fall).
FALL = 0.98
#: The steps of the arm over which its recent fall rate is carried on, per step it has had.
HORIZON = 0.1
#: A measured arm whose progress is at most this fraction of the median measured arm's is unlearnable.
UNLEARNABLE = 0.1
#: An arm left out whose held-out loss rises more than this fraction of its held-out fall above its
#: lowest is needed again: it gets its share back. A smaller rise (an arm learnt to its floor
#: forgets a little while idle) gets gated-heldout's least share.
RELEARN = 0.05


#: plateau(stats, pulls): whether an arm's fall is over (gated-plateau brings its own).
Plateau = Callable[[ArmStats, int], bool]


def plateaued(s: ArmStats, pulls: int) -> bool:
    """Whether FALL of the arm's fall is behind it, by the estimate of the module docstring."""
    if s.first_loss is None or s.loss_best is None:
        return False
    fall = s.first_loss - s.loss_best
    return fall > 0.0 and s.fall_rate * HORIZON * pulls <= (1.0 - FALL) / FALL * fall


def standing(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    plateau: Plateau = plateaued,
    relearn: bool = True,
) -> np.ndarray:
    """Per arm, whether it keeps its share (True) or gets only exploration (False); an arm not
    measured yet keeps it. `plateau`: whether an arm's fall is over; `relearn`: whether an arm
    being forgotten in earnest (`relearning`) gets its share back."""
    n = np.array(pulls)
    measured = n >= MEASURE_PULLS
    rho = np.array([s.progress for s in stats], dtype=np.float64)
    median = float(np.median(rho[measured])) if measured.any() else 0.0
    unlearnable = measured & (rho <= UNLEARNABLE * median) & (median > 0.0)
    flat = measured & ~unlearnable & np.array([plateau(s, p) for s, p in zip(stats, pulls)])
    again = relearning(stats) if relearn else np.zeros(len(stats), dtype=bool)
    # Most learnable arms flat at once is the LR's decay, or noise; an arm being forgotten in
    # earnest may be one left out wrongly: no plateau counts then, the learnable arms share alike.
    if 2 * int(flat.sum()) > int((measured & ~unlearnable).sum()) or again.any():
        flat[:] = False
    return ~(unlearnable | flat) | again


def relearning(stats: Sequence[ArmStats]) -> np.ndarray:
    """Per arm, whether it is being forgotten in earnest: learnt, its held-out loss rose at the
    newest evaluation, and it is now more than RELEARN of its held-out fall above its lowest."""
    out = []
    for s in stats:
        if not (s.forgotten and s.learnt) or s.heldout is None or s.heldout_low is None:
            out.append(False)
            continue
        assert s.first_loss is not None  # learnt
        out.append(s.heldout - s.heldout_low > RELEARN * (s.first_loss - s.heldout_low))
    return np.array(out, dtype=bool)


def forgotten(stats: Sequence[ArmStats]) -> np.ndarray:
    """Per arm, whether it is learnt and its held-out loss rose at the newest evaluation."""
    return np.array([s.forgotten and s.learnt for s in stats], dtype=bool)


def weights(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
    plateau: Plateau = plateaued,
    relearn: bool = True,
) -> np.ndarray:
    """An equal share for each arm that keeps one (`standing`, with `plateau` and `relearn`),
    exploration for the others; an arm still to measure gets a full share (its initial weight
    before any loss) until its measuring steps are assigned, then none until their losses are
    known."""
    n, k = np.array(pulls), len(stats)
    keeps = standing(stats, pulls, plateau, relearn).astype(np.float64)
    keeps[(n < MEASURE_PULLS) & (n + np.array(pending) >= MEASURE_PULLS)] = 0.0
    needs = n + np.array(pending) < MEASURE_PULLS
    keeps[needs] = np.array(initial, dtype=np.float64)[needs] if t == 0 else 1.0
    total = float(keeps.sum())
    if total <= 0.0:
        return np.full(k, 1.0 / k)
    fruitless = np.array([s.fruitless for s in stats], dtype=np.float64)
    e = np.where(keeps > 0.0, 0.0, reward.exploration_rate(k, t) / (k * (1.0 + fruitless)))
    w = max(0.0, 1.0 - float(e.sum())) * keeps / total + e
    # A plateaued arm being forgotten keeps a least share, as under gated-heldout (a full one
    # would bring back every arm learnt to its floor, which the model forgets a little when idle).
    return reward.protect_forgotten(w, (forgotten(stats) & (keeps == 0.0)).tolist())


def shares(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    plateau: Plateau = plateaued,
    relearn: bool = True,
) -> list[float]:
    """Each arm's share before exploration: equal among those that keep one."""
    keeps = standing(stats, pulls, plateau, relearn).astype(np.float64)
    return (keeps / keeps.sum()).tolist() if keeps.any() else [1.0 / len(stats)] * len(stats)


KIND = register(
    RewardKind(
        name="gated-fall",
        meaning="an equal share for every arm whose loss still falls (less than 98% of its "
        "fall behind it, and learnable), or whose held-out loss rises; exploration for the others",
        statistics=(*STATISTICS, "fruitless", *HELDOUT_STATISTICS, "fall_rate", "fall_pulls"),
        weights=weights,
        shares=shares,
        counts_pending=True,
        replayed=(*HELDOUT_STATISTICS, "fall_rate", "fall_pulls"),
    )
)
