"""What the bandit rewards an arm for, and the mixture weights that follow: the arms' loss statistics
and the pure float64 functions the built-in rewards (`Policy.reward`) make their mixtures of. Each
reward is a module of `andrea.daemon.mixing.rewards`, which finds it by name; its weights are these.

**loss** (ODM, Albalak et al. 2023): ``R_i <- alpha R_i + (1 - alpha) exp(min(loss, 700))`` when arm i
is trained, and ``w = (1 - K eps_t) softmax(eps_{t-1} R) + eps_t``. It rewards *difficulty*: an arm
the model cannot learn (random bytes: 5.55 nats however long it trains) keeps the highest reward and
takes most steps (87% measured, docs/mixing-quality.md). No 1/p_i importance weight: R_i is an EMA
that moves only when its arm is trained, already an estimate given a pull; EXP3's 1/p_i unbiases
cumulative sums, and here it would bias R_i upward and overflow exp(eps R) within a few steps (as in
the reference code; docs/bandit.md).

**learnability**: how much training on the arm still lowers its loss, the mixture proportional to
it (new runs got it before gated-learnability; their policies name it, and they keep it). Per arm,
over its own steps:

- ``m_i``: EMA of its training loss (``LEVEL_DECAY``: about 10 of its steps; the first loss starts it);
- ``b_i``: the lowest ``m_i`` so far in the phase;
- at each of its steps, its drop ``max(0, b_i - m_i)`` (taken before ``b_i`` moves down to ``m_i``):
  how far its loss just set a new low;
- ``rho_i``: the mean of its drops, each weighted by ``PROGRESS_DECAY ** (steps since it)`` — the
  nats per step of the arm by which its loss still sets new lows, over about the last 100 steps of
  the run (an arm trained rarely keeps few drops in that window, so old progress fades for it too).

Mixture: ``w = (1 - K eps_t) rho / sum(rho) + eps_t``, the reward of an arm being its share
``rho_i / sum(rho)`` of the recent progress: ratios only, so the same for any loss scale or rate of
learning. An arm with fewer than ``WARMUP_PULLS`` steps counts as the best measured one (it has not
been measured yet); when no arm makes progress the mixture is uniform.

Why new lows and not a slope: an arm the model cannot learn gets worse while other arms train (its
loss rises as the model specialises) and better again when it is trained — progress that only undoes
forgetting. A slope or a fast-minus-slow EMA sees that recovery as learning and keeps feeding the arm
(measured: 24-39% of the second half's steps on random bytes, 95% in stretches); its *lowest* loss
does not move, so it earns nothing and stays at its floor plus exploration. The same holds for an arm
learnt to its floor (a document repeated) once its loss stops setting lows. An arm that the other
arms' training improves sets a new low at each of its rarer steps, so starving a learnable arm
corrects itself.
Why proportional, not a softmax: late in a run every learnable arm's progress is a few thousandths of
a nat per step, within the noise of the estimate; a softmax sharp enough to starve a zero-progress arm
turns that noise into winner-take-all swings between learnable arms (measured: 95% on one arm).
Exploration is ODM's, eps_t per arm: besides re-measuring, it is the least share a learnable arm keeps
when the proportional rule favours another (measured: with eps_t / K instead, the three stdlib arms'
held-out mean was 0.01 and 0.04 nats worse on two seeds, for a saving of 0.03 on an unlearnable arm's
exploration in one replay).

**gated-learnability** (new runs got it before gated-learnability-2): the same statistics, used as a
gate rather than as proportions. With ``r_i = rho_i / max_j rho_j``, each arm's share is ``min(1, r_i / GATE)``
normalised: every arm whose progress is at least ``GATE`` (half) of the best arm's gets one equal
share, an arm below gets proportionally less, an arm that makes none gets nothing. Mixture:
``w = (1 - eps_t) shares + eps_t / K``.
Why a gate: late in a run every learnable arm's progress is a few thousandths of a nat per step and
its ratio to the best arm's wanders between 0.05 and 1 within a few hundred steps (new lows of a
noisy curve come in bursts). Proportions turn that noise into lasting tilts between learnable arms
(seed by seed one arm had 0.04 to 0.70 of the second half), and an arm tilted away trains less,
sets fewer lows and is tilted further. With the gate, arms that are all still learning share
alike, which is what a uniform mixture would do, and an arm loses share only when its progress
stays under half the best arm's (measured: the tilt remains, weaker; docs/mixing-quality.md).
Exploration eps_t / K per arm, not ODM's eps_t: the gate, not exploration, keeps a learnable arm's
share, and every step spent exploring an arm that cannot be learnt is taken from the learnable
ones.

**gated-learnability-2** (new runs got it before gated-heldout): the gate, with each arm measured
first and explored less as its steps bring nothing. For the draw of a step, an arm with fewer than
``MEASURE_PULLS`` losses known counts the steps already assigned to it whose losses are still on
their way (``pending``): while it lacks steps for its measurement it gets a full share, as the best
arm would (before any loss, its initial weight), and once it has them, nothing but exploration until
their losses arrive. Measured arms are gated as above. Exploration of arm i is
``e_i = eps_t / (K (1 + f_i))``, with ``f_i`` its steps since its loss EMA last set a new low, and
``w = (1 - sum e) shares + e``.
Why measure first: the bandit must train an arm to learn that it cannot be learnt, and counting an
arm as the best until its losses are *known* gave it a full share of the W steps after each of its
first steps — for random bytes, 4 to 7 steps where the LR peaks (four in a row on one seed cost 0.22
nats at the end of the run). Two steps measure an arm's first drop; ``pending`` stops it there.
Why this exploration: once measured, exploration only re-measures an arm the gate gives little. An
arm that cannot be learnt never sets a new low again, so each exploration step makes the next less
likely (about sqrt(2 N) steps where eps_t / K spends N: 8 to 15 steps on random bytes in 1,500). A
learnable arm the gate starved sets a new low as soon as it is trained again (the others' training
lowered its loss meanwhile), so it keeps eps_t / K and its full share comes back soon. A flat
eps_t / K**2 for every arm would leave such an arm starved K times as long (measured with it:
case a +0.026 nats against uniform, this rule +0.002; docs/mixing-quality.md).

**gated-heldout** (the default of new runs): gated-learnability-2, and a least share for an arm the
held-out evaluations show being forgotten, read from the evaluations the loss records carry
(`observe_heldout`; docs/bandit.md says how they reach the bandit with the losses, in step order and
with the same lag). A learnt arm whose held-out loss rises gets at least ``FORGETTING_SHARE / K``
(an eighth of a uniform share).
Why: the training losses cannot see forgetting, since an arm the gate starves has none; the
evaluations score every arm whatever trained. An arm whose held-out loss is higher than at the
evaluation before, and above its lowest by ``RISE_TOLERANCE``, is being forgotten, and keeps a few
steps per hundred until it stops rising. "Learnt" (its held-out loss went ``LEARNT_MARGIN`` below
its first training loss of the phase, what the model scored on it before learning anything of it)
keeps random bytes out: their floor is the untrained model's ln 256, and their rise while the model
learns text is nothing forgotten. The bound stays under half of 1/K, the share under which an arm
counts as given up, so that an arm learnt to its floor, then forgotten, is still seen as given up.
What was tried and not adopted (docs/mixing-quality.md has the runs): the held-out losses as the
progress itself (their new lows per step of the arm, or a plateau called when they stop moving for
one or two evaluations), and the gate measured against the median arm rather than the best. At
andrea-tiny an arm's held-out loss follows the recent mixture (an arm left alone for 100 steps rises
by 0.16 to 0.37 nats, a learnable one can stay flat for an interval), so the first cut learnable arms
as often as plateaued ones; the median gate kept plateaued arms longer.

**gated-fall** (the default of new runs until gated-plateau) is its own module,
daemon/mixing/rewards/gated_fall.py: a uniform mixture over the learnable arms whose fall is not
over. It reads one more statistic, ``fall_rate``: the arm's drops (as rho's), an EMA over its own
steps whose memory is about the last ``FALL_SPAN`` of them and at least the last few
(``FALL_DECAY``), so that its early fall stops counting within a few of its steps.

All rewards keep all these statistics (a few float operations per step), so that status shows each
arm's recent loss and progress whichever reward makes the mixture.

**gated-plateau** (the default of new runs, daemon/mixing/rewards/gated_plateau.py) keeps statistics
of its own, folded in by its `RewardKind.observe` after these: the arm's newest ``RECENT_KEPT``
losses and their steps, the step of its first loss, and its plateau call (the level then, and the
step of the call or of its newest retest). The other rewards leave them empty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: exp() overflows float64 just above 709.78; losses above this many nats count as this many, so a
#: diverging step still reads as "very hard" without turning the reward into inf (and then NaN).
MAX_EXP_LOSS = 700.0
#: Weight of the previous value in each arm's loss EMA (m_i), per step of that arm.
LEVEL_DECAY = 0.9
#: Weight kept per step of the run by each past drop in rho_i (about 100 steps).
PROGRESS_DECAY = 0.99
#: Weight of the previous value in each arm's fall rate (its recent drops), per step of that arm:
#: about its last 5 steps, so that an arm's early fall is forgotten within a few of its steps.
FALL_DECAY = 0.8
#: The fraction of an arm's steps over which its fall rate averages, once that is more than a few.
FALL_SPAN = 0.15
#: An arm with fewer steps in the phase than this has not been measured: it counts as the best.
WARMUP_PULLS = 3
#: gated-learnability: the fraction of the best arm's progress from which an arm gets a full share.
GATE = 0.5
#: gated-learnability-2: an arm is measured once this many of its losses are known (its first drop).
MEASURE_PULLS = 2
#: gated-heldout: an arm counts as learnt once its held-out loss is this fraction below its first
#: training loss of the phase (what the model scored on it before learning anything of it).
LEARNT_MARGIN = 0.02
#: gated-heldout: a held-out loss higher than at the evaluation before, and this fraction above the
#: arm's lowest, is being forgotten.
RISE_TOLERANCE = 0.01
#: gated-heldout: a learnt arm being forgotten gets at least this fraction of a uniform share, 1/K.
FORGETTING_SHARE = 0.125
#: gated-plateau: the newest training losses of an arm it keeps (rewards/gated_plateau.py).
RECENT_KEPT = 100


@dataclass
class ArmStats:
    """One arm's loss statistics in the current phase (all None/0 before its first step)."""

    ema_reward: float = 0.0  # the loss reward's R_i
    loss_ema: float | None = None  # m_i, also the arm's "recent training loss" for people
    loss_best: float | None = None  # b_i
    progress_sum: float = 0.0  # D_i: its drops, each weighted by PROGRESS_DECAY ** its age in steps
    progress_pulls: float = 0.0  # P_i: its steps, weighted alike (rho_i = D_i / P_i)
    last_pull: int = 0  # the step of its last loss
    fruitless: int = 0  # its steps since its loss EMA last set a new low
    first_loss: float | None = None  # its first training loss of the phase
    heldout: float | None = None  # its held-out loss at the newest evaluation
    heldout_low: float | None = None  # its lowest held-out loss of the phase
    heldout_evals: int = 0  # the evaluations of it seen in the phase
    forgotten: bool = False  # its held-out loss rose at the newest evaluation, above its low
    fall_rate: float = 0.0  # its drops, an EMA over its own recent steps (FALL_DECAY, FALL_SPAN)
    fall_pulls: int = 0  # its steps after its first, as the fall rate counts them
    # gated-plateau's own (rewards/gated_plateau.py), kept under that reward only:
    recent_losses: list[float] = field(default_factory=list)  # its newest losses, the newest last
    recent_steps: list[int] = field(default_factory=list)  # the steps of those losses
    first_step: int = 0  # the step of its first loss of the phase (0: none yet)
    cut_level: float | None = None  # its loss level when called plateaued (None: not called)
    cut_step: int = 0  # the step of that call, or of its newest retest (0: not called)

    @property
    def learnt(self) -> bool:
        """Whether its held-out loss ever went below what the model scored on it before learning
        anything of it: an arm never learnt (random bytes) cannot be forgotten."""
        if self.heldout_low is None or self.first_loss is None:
            return False
        return self.heldout_low < self.first_loss - LEARNT_MARGIN * abs(self.first_loss)

    @property
    def progress(self) -> float:
        """rho_i: the mean drop per step of this arm, over its recent steps."""
        return self.progress_sum / self.progress_pulls if self.progress_pulls > 0.0 else 0.0


def clamp_loss(loss: float) -> float:
    """A finite loss as every statistic sees it: within MAX_EXP_LOSS nats of 0, so that the
    differences taken from it stay finite."""
    return min(max(loss, -MAX_EXP_LOSS), MAX_EXP_LOSS)


def observe(stats: ArmStats, step: int, loss: float, alpha: float) -> None:
    """Fold the training loss of `step`, trained on this arm, into its statistics (`alpha`: the
    loss reward's EMA)."""
    stats.ema_reward = alpha * stats.ema_reward + (1.0 - alpha) * math.exp(min(loss, MAX_EXP_LOSS))
    x = clamp_loss(loss)
    age = PROGRESS_DECAY ** (step - stats.last_pull)
    stats.last_pull = step
    if stats.loss_ema is None or stats.loss_best is None:
        stats.loss_ema = stats.loss_best = stats.first_loss = x
        stats.fruitless = 0
        return
    stats.loss_ema = LEVEL_DECAY * stats.loss_ema + (1.0 - LEVEL_DECAY) * x
    drop = max(0.0, stats.loss_best - stats.loss_ema)
    stats.fruitless = 0 if drop > 0.0 else stats.fruitless + 1
    stats.loss_best = min(stats.loss_best, stats.loss_ema)
    stats.progress_sum = age * stats.progress_sum + drop
    # Over about the last FALL_SPAN of its steps, and at least its last few: an arm's early fall is
    # forgotten soon, and a slow arm's new lows, which come in bursts, are averaged over more steps.
    stats.fall_pulls += 1
    decay = max(FALL_DECAY, 1.0 - 1.0 / (FALL_SPAN * stats.fall_pulls))
    stats.fall_rate = decay * stats.fall_rate + (1.0 - decay) * drop
    stats.progress_pulls = age * stats.progress_pulls + 1.0


def observe_heldout(stats: ArmStats, loss: float) -> None:
    """Fold the arm's held-out loss at an evaluation into its statistics: its lowest, and whether
    it is being forgotten (higher than at the evaluation before, and RISE_TOLERANCE above its
    lowest)."""
    x = clamp_loss(loss) if not math.isnan(loss) else MAX_EXP_LOSS
    before, low = stats.heldout, stats.heldout_low
    if before is None or low is None:
        stats.heldout = stats.heldout_low = x
    else:
        stats.forgotten = x > before and x > low + RISE_TOLERANCE * abs(low)
        stats.heldout, stats.heldout_low = x, min(low, x)
    stats.heldout_evals += 1


def exploration_rate(k: int, t: int) -> float:
    """eps_t = min(1/K, sqrt(ln K / (K t))) for t >= 1; eps_0 = 1/K (ODM's starting value)."""
    if k < 1 or t < 0:
        raise ValueError(f"exploration_rate needs K >= 1 and t >= 0, got K={k}, t={t}")
    if t == 0:
        return 1.0 / k
    return min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


def _explore(soft: np.ndarray, t: int) -> np.ndarray:
    k = soft.size
    eps = exploration_rate(k, t)
    # K * fl(1/K) can exceed 1 by an ulp; the mixture coefficient must not go negative.
    return max(0.0, 1.0 - k * eps) * soft + eps


def mixture_weights(rewards: np.ndarray, t: int) -> np.ndarray:
    """The loss reward: w = (1 - K eps_t) softmax(eps_{t-1} R) + eps_t, for t >= 1 (sums to 1)."""
    r = np.asarray(rewards, dtype=np.float64)
    z = exploration_rate(r.size, t - 1) * r
    # Subtracting the max keeps exp() finite for rewards up to exp(MAX_EXP_LOSS).
    e = np.exp(z - z.max())
    return _explore(e / math.fsum(e), t)


def initial_mixture(initial: Sequence[float]) -> np.ndarray:
    """The policy's initial weights, normalised: the mixture before any loss."""
    return np.array(initial, dtype=np.float64) / math.fsum(initial)


def _progress(progress: list[float], pulls: list[int]) -> np.ndarray:
    """rho per arm, an arm not measured yet counted as the best measured one (or 1 if none)."""
    rho = np.array(progress, dtype=np.float64)
    measured = np.array(pulls) >= WARMUP_PULLS
    best = float(rho[measured].max()) if measured.any() else 0.0
    rho[~measured] = best if best > 0.0 else 1.0
    return rho


def progress_shares(progress: list[float], pulls: list[int]) -> np.ndarray:
    """The learnability reward of each arm: its share of the recent progress (sums to 1)."""
    rho = _progress(progress, pulls)
    total = math.fsum(rho)
    if total <= 0.0:
        return np.full(rho.size, 1.0 / rho.size)
    return rho / total


def learnability_weights(progress: list[float], pulls: list[int], t: int) -> np.ndarray:
    """The learnability reward: w = (1 - K eps_t) shares + eps_t, for t >= 1 (sums to 1)."""
    return _explore(progress_shares(progress, pulls), t)


def gated_shares(progress: list[float], pulls: list[int]) -> np.ndarray:
    """The gated-learnability reward of each arm: min(1, r_i / GATE) normalised (sums to 1)."""
    rho = _progress(progress, pulls)
    top = float(rho.max())
    if top <= 0.0:
        return np.full(rho.size, 1.0 / rho.size)
    r = np.minimum(1.0, rho / top / GATE)
    return r / math.fsum(r)


def gated_weights(progress: list[float], pulls: list[int], t: int) -> np.ndarray:
    """The gated-learnability reward: w = (1 - eps_t) shares + eps_t / K, for t >= 1."""
    shares = gated_shares(progress, pulls)
    k = shares.size
    eps = exploration_rate(k, t) / k
    return max(0.0, 1.0 - k * eps) * shares + eps


def measuring_shares(
    progress: list[float], pulls: list[int], pending: list[int], initial: list[float] | None = None
) -> np.ndarray:
    """gated-learnability-2's share of each arm (sums to 1). `pending`: each arm's steps assigned
    but whose losses are not known yet; `initial`: the policy's initial weights, used before any
    loss is known."""
    n = np.array(pulls)
    rho = np.array(progress, dtype=np.float64)
    measured = n >= MEASURE_PULLS
    needs = n + np.array(pending) < MEASURE_PULLS
    shares = np.zeros(rho.size)
    if measured.any():
        top = float(rho[measured].max())
        shares[measured] = np.minimum(1.0, rho[measured] / top / GATE) if top > 0.0 else 1.0
    shares[needs] = 1.0 if initial is None else np.array(initial)[needs]
    total = math.fsum(shares)
    if total <= 0.0:
        return np.full(rho.size, 1.0 / rho.size)
    return shares / total


def measuring_weights(
    progress: list[float],
    pulls: list[int],
    pending: list[int],
    fruitless: list[int],
    t: int,
    initial: list[float] | None = None,
) -> np.ndarray:
    """gated-learnability-2: w_i = (1 - sum_j e_j) shares_i + e_i, e_i = eps_t / (K (1 + f_i))
    with f_i the arm's steps since its last new low (sums to 1)."""
    shares = measuring_shares(progress, pulls, pending, initial)
    k = shares.size
    e = exploration_rate(k, t) / (k * (1.0 + np.array(fruitless, dtype=np.float64)))
    return max(0.0, 1.0 - math.fsum(e)) * shares + e


def protect_forgotten(w: np.ndarray, forgotten: list[bool]) -> np.ndarray:
    """`w` with every arm being forgotten raised to FORGETTING_SHARE / K, the others scaled down to
    make room, in proportion (sums to 1).

    When the arms being forgotten already hold all the weight between them (one holds nearly all of
    it and a second is raised), the others would be left nothing: a weight of 0, which the caps and
    floors' projection refuses. Then the room is taken from every arm's weight above its own least
    (FORGETTING_SHARE / K for an arm being forgotten, 0 for the others), in proportion to it: the
    least shares sum to at most FORGETTING_SHARE, so there is always weight above them to take
    from, and an arm with weight keeps some. Every other case keeps the weights it always had, so
    that a run's assignments stay what they were; with every arm being forgotten, that is the
    raised weights normalised, each a little under the bound."""
    mask = np.array(forgotten, dtype=bool)
    if not mask.any():
        return w
    least = np.where(mask, FORGETTING_SHARE / w.size, 0.0)
    out = np.maximum(w, least)
    room, rest = 1.0 - math.fsum(out[mask]), math.fsum(w[~mask])
    if rest > 0.0 and room <= 0.0:
        above = out - least
        return least + above * (1.0 - math.fsum(least)) / math.fsum(above)
    if rest > 0.0:
        out[~mask] = w[~mask] * room / rest
    return out / math.fsum(out)


def heldout_weights(
    stats: list[ArmStats],
    pulls: list[int],
    pending: list[int],
    t: int,
    initial: list[float] | None = None,
) -> np.ndarray:
    """gated-heldout (sums to 1): gated-learnability-2's weights, then at least
    FORGETTING_SHARE / K for every learnt arm being forgotten."""
    progress, fruitless = [s.progress for s in stats], [s.fruitless for s in stats]
    w = measuring_weights(progress, pulls, pending, fruitless, t, initial)
    return protect_forgotten(w, [s.forgotten and s.learnt for s in stats])
