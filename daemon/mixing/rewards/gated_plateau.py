"""The gated-plateau reward, the default of new runs: gated-fall's mixture (rewards/gated_fall.py)
with a plateau called from a line through the arm's own losses, a call that holds, and a retest
that can end it.

Per arm it keeps its newest ``RECENT_KEPT`` training losses and their steps (reward.py), and:

- *the line*: the least-squares line through the newest quarter (``WINDOW``) of the arm's losses of
  the phase, at most its last ``RECENT_KEPT``, and at least ``MIN_LOSSES``, against their steps:
  its level now, its slope per step, and the slope's standard error from the residuals;
- *what may be left of its fall*: the slope plus ``Z`` standard errors, carried on over as many
  steps as the phase has had since the arm's first loss, and at most its level (a cross-entropy is
  never below 0);
- *the call*: once that is at most 2% of 98% of its fall so far (its first loss less its level),
  ``FALL`` of its fall is behind it with about 97.5% confidence, and the arm is called plateaued,
  its level kept (``cut_level``). The call holds while the arm is left out: an arm not trained has
  losses, frozen or rising as it is forgotten, that would read as a fall still to come;
- *the retest*: ``RETEST`` steps after the call, or after its newest retest, the arm gets its share
  back until ``BURST`` of its losses are known; the call ends if the mean of the second half of
  them is below the level at the call by ``MARGIN`` of its fall, and stands otherwise, until the next
  retest. Outside a retest, a level that low ends it at once.

Why the standard error: a step's loss is a new batch, and its noise is the batches'. An arm learnt to
its floor (letters drawn with fixed odds) scores its entropy on every batch to a few hundredths; a
text arm's batches differ by a tenth of a nat and more, and a line through its losses has a slope
too uncertain to rule out the rest of its fall. In replays of uniform runs a stdlib arm was called on
at most 13 of its 344-517 steps, where gated-fall's estimate called it on 58-85% of them
(docs/mixing-quality.md, "Seeing the plateau sooner").

Why the retest: a call cannot tell a text arm's stall from the letters' floor, which read the same on
the arm's past; the difference is in its future, when it is trained again. A stalled text arm gets a
chance every ``RETEST`` steps to show its fall resumed; the letters, relearnt in a few steps, show
none. Why a plateaued arm being forgotten does not get its share back (gated-fall's ``RELEARN``): the
letters left out are forgotten by more than a nat in 100 steps at batches of 8, and a full share
brought them back for hundreds of steps each time. Such an arm keeps the least share of an arm being
forgotten instead (gated-heldout's).

Everything else is gated-fall's: each arm measured first, an unlearnable arm's exploration, no plateau
counting while more than half the learnable arms are plateaued. Every statistic is in the state, so a
restart continues the same mixture (the retest's clock is the steps of the arms' losses, not time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from andrea.daemon.mixing.reward import RECENT_KEPT, ArmStats, clamp_loss
from andrea.daemon.mixing.rewards import RewardKind, gated_fall, register

#: An arm is plateaued once this fraction of its fall is behind it (gated-fall's).
FALL = gated_fall.FALL
#: The fraction of the arm's losses of the phase (at most its last RECENT_KEPT / WINDOW) that the
#: line is fitted over: its recent curve, longer as the arm's history grows.
WINDOW = 0.25
#: The fewest losses the line is fitted over, and the fewest before any call.
MIN_LOSSES = 8
#: Standard errors added to the slope: a call rules out the rest of the fall this surely.
Z = 2.0
#: The steps of the run from a call, or from its newest retest, to the next retest.
RETEST = 200
#: The arm's losses a retest waits for; the mean of the second half of them is judged.
BURST = 16
#: A call ends when the arm's level is this fraction of its fall below its level at the call: a new
#: low, not its noise.
MARGIN = 0.01


def line(losses: Sequence[float], steps: Sequence[int], count: int) -> tuple[float, float, float]:
    """(level at the newest step, slope per step, the slope's standard error) of the least-squares
    line through the newest `count` of `losses` against their `steps`."""
    x, y = steps[-count:], losses[-count:]
    mx, my = math.fsum(x) / count, math.fsum(y) / count
    sxx = math.fsum((a - mx) ** 2 for a in x)
    slope = math.fsum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    rss = math.fsum((b - my - slope * (a - mx)) ** 2 for a, b in zip(x, y))
    return my + slope * (x[-1] - mx), slope, math.sqrt(rss / (count - 2) / sxx)


def window(s: ArmStats) -> int:
    """How many of the arm's newest losses the line is fitted over (0: too few to fit one)."""
    seen = min(s.fall_pulls + 1, round(RECENT_KEPT / WINDOW))  # its losses of the phase
    count = max(MIN_LOSSES, round(WINDOW * seen))
    return count if len(s.recent_losses) >= count else 0


def fall_ended(s: ArmStats) -> tuple[bool, float] | None:
    """Whether the arm's losses rule out more than 2% of 98% of its fall still to come, and its
    level now; None before the line can be fitted."""
    count = window(s)
    if count == 0 or s.first_loss is None:
        return None
    level, slope, se = line(s.recent_losses, s.recent_steps, count)
    horizon = s.recent_steps[-1] - s.first_step
    left = min(max(level, 0.0), max(0.0, -slope + Z * se) * horizon)
    fall = s.first_loss - level
    return fall > 0.0 and left <= (1.0 - FALL) / FALL * fall, level


def retest_losses(s: ArmStats) -> list[float]:
    """The arm's losses since its retest came due (none before)."""
    due = s.cut_step + RETEST
    return [x for x, step in zip(s.recent_losses, s.recent_steps) if step > due]


def observe(s: ArmStats, step: int, loss: float) -> None:
    """Fold the arm's loss of `step` into its recent losses, then make, keep or end its call."""
    if s.first_step == 0:
        s.first_step = step
    s.recent_losses = [*s.recent_losses[1 - RECENT_KEPT :], clamp_loss(loss)]
    s.recent_steps = [*s.recent_steps[1 - RECENT_KEPT :], step]
    found = fall_ended(s)
    if found is None:
        return
    ended, level = found
    assert s.first_loss is not None  # a line is fitted only once the arm has a first loss
    if s.cut_level is None:
        if ended:
            s.cut_level, s.cut_step = level, step
        return
    low = s.cut_level - MARGIN * (s.first_loss - s.cut_level)
    burst = retest_losses(s)
    if len(burst) >= BURST:
        judged = burst[BURST // 2 : BURST]
        if math.fsum(judged) / len(judged) < low:
            s.cut_level, s.cut_step = None, 0
        else:
            s.cut_step = step
    elif not burst and level < low:
        s.cut_level, s.cut_step = None, 0


def newest_step(stats: Sequence[ArmStats]) -> int:
    """The newest step of a loss of an arm with a line: the retests' clock."""
    return max((s.recent_steps[-1] for s in stats if window(s)), default=0)


def plateaued(s: ArmStats, now: int) -> bool:
    """Whether the arm is called plateaued and not being retested at step `now`."""
    if s.cut_level is None:
        return False
    return not (now > s.cut_step + RETEST and len(retest_losses(s)) < BURST)


def weights(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
) -> np.ndarray:
    """gated-fall's weights with this module's plateau, and no share back for a plateaued arm
    being forgotten (it keeps the least share of one)."""
    now = newest_step(stats)
    return gated_fall.weights(
        stats, pulls, pending, t, initial, lambda s, _: plateaued(s, now), relearn=False
    )


def shares(stats: Sequence[ArmStats], pulls: Sequence[int]) -> list[float]:
    """gated-fall's shares with this module's plateau."""
    now = newest_step(stats)
    return gated_fall.shares(stats, pulls, lambda s, _: plateaued(s, now), relearn=False)


OWN_STATISTICS = ("recent_losses", "recent_steps", "first_step", "cut_level", "cut_step")

KIND = register(
    RewardKind(
        name="gated-plateau",
        meaning="an equal share for every learnable arm whose own losses do not rule out 2% of "
        "its fall still to come, or that a retest found falling again; exploration for the others",
        statistics=(*gated_fall.KIND.statistics, *OWN_STATISTICS),
        weights=weights,
        shares=shares,
        counts_pending=True,
        replayed=(*gated_fall.KIND.replayed, *OWN_STATISTICS),
        observe=observe,
    )
)
