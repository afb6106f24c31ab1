"""gated-fall, the default of new runs until gated-plateau: its plateau (98% of an arm's fall) by hand, its fall rate by
hand, and on the synthetic learners of tests/support/bandit.py an arm that learns fast all run long
and teaches the others nothing (the learnable-but-useless class of issue #49): it never gets more
than a uniform share while another arm is being forgotten, where gated-heldout gives it more."""

from __future__ import annotations

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.reward import FALL_DECAY, FALL_SPAN, LEVEL_DECAY, ArmStats
from andrea.daemon.mixing.rewards import gated_fall
from tests.support.bandit import TEXT3, Learner


def test_the_fall_rate_by_hand() -> None:
    s = ArmStats()
    losses = [5.0, 4.0, 4.2, 3.0, 3.5, 3.5, 2.0]
    m = b = rate = None
    pulls = 0
    for step, x in enumerate(losses, 1):
        reward.observe(s, step, x, alpha=0.9)
        if m is None or b is None or rate is None:
            m = b = x
            rate = 0.0
            continue
        m = LEVEL_DECAY * m + (1 - LEVEL_DECAY) * x
        drop = max(0.0, b - m)
        b = min(b, m)
        pulls += 1
        decay = max(FALL_DECAY, 1 - 1 / (FALL_SPAN * pulls))
        rate = decay * rate + (1 - decay) * drop
        assert (s.fall_rate, s.fall_pulls) == (rate, pulls)


def test_the_plateau_is_98_percent_of_the_fall() -> None:
    s = ArmStats(first_loss=5.0, loss_best=1.0, loss_ema=1.0, fall_pulls=40)
    # What is left is estimated as fall_rate * HORIZON * pulls; 2% of the fall is 98% behind it.
    edge = (1 - gated_fall.FALL) / gated_fall.FALL * 4.0 / (gated_fall.HORIZON * 40)
    s.fall_rate = edge * 0.99
    assert gated_fall.plateaued(s, 40)
    s.fall_rate = edge * 1.01
    assert not gated_fall.plateaued(s, 40)
    # An arm that has not fallen (random bytes' loss never sets a new low) has no plateau to see.
    assert not gated_fall.plateaued(ArmStats(first_loss=5.5, loss_best=5.5), 40)


class FastLearner(Learner):
    """The stdlib arms of `Learner`, and `fast`: an arm that learns faster than they do all run
    long (its loss falls as 1/(1 + n/30)) and does nothing for them."""

    def loss(self, arm: str) -> float:
        if self.kinds[arm] != "fast":
            return super().loss(arm)
        value = 0.8 + 4.7 / (1 + self.pulls[arm] / 30) + self.rng.normal(0, 0.05)
        self.t += 1
        self.pulls[arm] += 1
        self.last[arm] = self.t
        return value

    def heldout(self, arm: str) -> float:
        if self.kinds[arm] != "fast":
            return super().heldout(arm)
        return 0.8 + 4.7 / (1 + self.pulls[arm] / 30)


def fast_run(kind: str, seed: int, steps: int = 1500) -> tuple[list[str], list[float]]:
    """The arms trained, and at every step by how much the fast arm's probability exceeded the
    largest of the others' (evaluations every 100 steps)."""
    kinds = {**TEXT3, "fast": "fast"}
    policy = Policy(reward=kind)
    b = Bandit([ConfiguredArm(n, n, True) for n in kinds], policy, seed=seed)
    learner = FastLearner(kinds, seed)
    losses: dict[int, tuple[str, float]] = {}
    heldout: dict[int, dict[str, float]] = {}
    trained, lead = [], []
    for s in range(1, steps + 1):
        while b.last_step < s - policy.lag:
            j = b.last_step + 1
            b.observe(j, *losses[j], heldout.get(j))
        pending = [losses[j][0] for j in range(b.last_step + 1, s)]
        p = b.probabilities(pending)
        lead.append(p["fast"] - max(p[n] for n in TEXT3))
        arm = b.assign(s, pending)
        losses[s] = (arm, learner.loss(arm))
        trained.append(arm)
        if s % 100 == 0:
            heldout[s + 1] = {n: learner.heldout(n) for n in kinds}
    return trained, lead


def test_an_arm_learnable_but_useless_never_gets_more_than_an_arm_still_learning() -> None:
    """No arm ever draws with more probability than every stdlib arm: the learnable arms share
    alike, an arm left out gets exploration only, and most arms flat at once (which the stdlib
    arms' noisy late curves can look) count as none. gated-heldout's gate favours the arm that
    learns fastest: more than every other arm at hundreds of steps. (Its share of the second half
    is still above 1/4 on this learner, 0.24 to 0.28, as gated-heldout's: a stdlib arm whose noisy
    curve looks flat is left out for a while, and the others share its steps.)"""
    # After the first 2 W steps, where an arm still to measure gets its 2 steps first.
    fall = [fast_run("gated-fall", seed) for seed in range(3)]
    assert max(max(lead[16:]) for _, lead in fall) <= 1e-12
    held = [fast_run("gated-heldout", seed) for seed in range(3)]
    assert min(sum(x > 0.001 for x in lead[16:]) for _, lead in held) > 300
