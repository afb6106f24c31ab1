"""gated-heldout, the default reward of new runs: gated-learnability-2, and a least share for every
learnt arm whose held-out loss rises, read from the evaluations the loss records carry. Shares
computed here by hand from the numbers fed in; the restart bit for bit with evaluations is in
tests/unit/test_assignbook.py and, with real processes and SIGKILLs, tests/process/test_proxy.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm, parse_state
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.reward import ArmStats
from tests.support.bandit import TEXT3, run, second_half_share

ARMS = [ConfiguredArm(n, n, True) for n in "abcd"]


def test_held_out_statistics_by_hand() -> None:
    s = ArmStats()
    reward.observe(s, 1, 5.5, 0.9)
    assert s.first_loss == 5.5 and not s.learnt  # no evaluation yet
    for value, forgotten in ((3.0, False), (2.5, False), (2.52, False), (2.6, True), (2.7, True)):
        reward.observe_heldout(s, value)
        assert s.forgotten is forgotten, value
    # 2.52 rose, but by less than 1% of the low (2.5); 2.6 and 2.7 rose above 2.525.
    assert (s.heldout, s.heldout_low, s.heldout_evals, s.learnt) == (2.7, 2.5, 5, True)
    reward.observe_heldout(s, 2.6)  # falling again: no longer being forgotten
    assert not s.forgotten
    # An arm never learnt: its held-out loss never went 2% below its first training loss.
    r = ArmStats()
    reward.observe(r, 1, 5.55, 0.9)
    for value in (5.6, 5.9, 6.3):
        reward.observe_heldout(r, value)
    assert r.forgotten and not r.learnt


def test_a_learnt_arm_being_forgotten_keeps_an_eighth_of_a_uniform_share() -> None:
    w = np.array([0.6, 0.3, 0.095, 0.005])
    got = reward.protect_forgotten(w, [False, False, False, True])
    bound = 0.125 / 4
    rest = (1 - bound) / 0.995
    assert got == pytest.approx([0.6 * rest, 0.3 * rest, 0.095 * rest, bound], abs=1e-15)
    # An arm above the bound keeps what it has.
    assert reward.protect_forgotten(w, [True, False, False, False]) == pytest.approx(w)


def test_two_arms_being_forgotten_leave_the_others_some_weight() -> None:
    # The heavy arm being forgotten too: lifting the light one takes from every arm's weight
    # above its own least, so the arms not forgotten keep some (they got 0 before, and the
    # bandit's projection then refused the weights).
    w = np.array([0.97, 0.01, 0.01, 0.01])
    got = reward.protect_forgotten(w, [True, True, False, False])
    bound = 0.125 / 4
    scale = (1 - 2 * bound) / (0.97 - bound + 0.01 + 0.01)
    want = [bound + (0.97 - bound) * scale, bound, 0.01 * scale, 0.01 * scale]
    assert got == pytest.approx(want, abs=1e-15)
    assert math.fsum(got) == pytest.approx(1.0, abs=1e-15)


def test_the_bandit_goes_on_when_its_heavy_arm_and_a_light_one_are_forgotten() -> None:
    # a learns all along; b and c never set a new low after their first loss, so the gate gives a
    # nearly everything. Then a and b are both forgotten: the bandit raised b and left c a weight
    # of 0, and its projection refused it (ValueError) before the fix.
    b = Bandit([ConfiguredArm(n, n, True) for n in "abc"], Policy(reward="gated-heldout"), seed=1)
    seq = ["a", "b", "c", "b", "c"] + ["a"] * 300 + ["b", "c"] * 5
    for s, arm in enumerate(seq, start=1):
        b.observe(s, arm, 5.5 - 0.01 * seq[:s].count("a") if arm == "a" else 5.5)
    assert b.probabilities()["a"] > 0.99
    n, last = len(seq), 5.5 - 0.01 * seq.count("a")
    b.observe(n + 1, "a", last - 0.01, {"a": 3.0, "b": 3.0, "c": 3.0})
    b.observe(n + 2, "a", last - 0.02, {"a": 3.2, "b": 3.2, "c": 2.9})
    p = b.probabilities()
    assert p["b"] == pytest.approx(0.125 / 3, abs=1e-15)
    assert 0.0 < p["c"] < 0.01 and math.fsum(p.values()) == pytest.approx(1.0, abs=1e-12)


def test_the_least_share_holds_for_any_weights() -> None:
    rng = np.random.default_rng(7)
    for _ in range(2000):
        k = int(rng.integers(2, 9))
        w = rng.dirichlet(np.full(k, 0.3))
        forgotten = (rng.random(k) < 0.5).tolist()
        got = reward.protect_forgotten(w, forgotten)
        assert math.fsum(got) == pytest.approx(1.0, abs=1e-12)
        for wi, gi, f in zip(w, got, forgotten):
            assert gi > 0.0 or wi == 0.0  # an arm with weight keeps some
            # With every arm being forgotten there is no other arm to make room, and the raised
            # weights are normalised as they always were (a little under the bound).
            if f and not all(forgotten):
                assert gi >= 0.125 / k - 1e-15


def test_the_mixture_by_hand() -> None:
    """heldout_weights: w = (1 - sum e) shares + e with e_i = eps_t / (K (1 + f_i)), then the
    bound for the learnt arm being forgotten."""
    stats = [ArmStats() for _ in range(4)]
    for s, (progress, fruitless) in zip(stats, [(0.04, 0), (0.01, 2), (0.004, 5), (0.0, 40)]):
        s.progress_sum, s.progress_pulls, s.fruitless = progress, 1.0, fruitless
    d = stats[3]
    reward.observe(d, 1, 5.5, 0.9)
    d.progress_sum, d.progress_pulls, d.fruitless = 0.0, 1.0, 40
    for value in (2.0, 1.5, 1.7):
        reward.observe_heldout(d, value)
    assert d.learnt and d.forgotten
    t = 400
    eps = min(1 / 4, math.sqrt(math.log(4) / (4 * t)))
    e = np.array([eps / (4 * (1 + f)) for f in (0, 2, 5, 40)])
    # gated-learnability-2's gate: a full share from half the best arm's progress (0.04).
    w = (1 - e.sum()) * np.array([1, 0.5, 0.2, 0]) / 1.7 + e
    want = reward.protect_forgotten(w, [False, False, False, True])
    got = reward.heldout_weights(stats, [9, 9, 9, 9], [0] * 4, t, [1.0] * 4)
    assert got == pytest.approx(want, abs=1e-15)
    assert got[3] == pytest.approx(0.125 / 4) and w[3] < 0.125 / 4


def feed(rising: bool) -> Bandit:
    """Arms a, b, c learn (their losses fall at every step); d's loss is flat, so the gate gives
    it only exploration (its held-out loss, 1.5, is below its first training loss: it was
    learnt). The record of step 201 carries an evaluation in which d's held-out loss rose
    (`rising`) or fell."""
    b = Bandit(ARMS, Policy(reward="gated-heldout", lag=1), seed=3)
    for step in range(1, 202):
        arm = "abcd"[(step - 1) % 4]
        loss = 2.0 if arm == "d" else 5.5 - 0.001 * step
        heldout = None
        if step in (101, 201):
            d = 1.5 if step == 101 else (1.8 if rising else 1.45)
            heldout = {"a": 3.0 - step / 1000, "b": 3.0 - step / 900, "c": 3.1 - step / 800, "d": d}
        b.observe(step, arm, loss, heldout)
    return b


def test_the_bandit_gives_a_forgotten_arm_its_bound_and_only_then() -> None:
    rising, falling = feed(True), feed(False)
    assert rising.probabilities()["d"] == pytest.approx(0.125 / 4)
    assert falling.probabilities()["d"] < 0.01
    # Everything else the two bandits saw is the same: a's statistics, not its share.
    mixture = {"weight", "probability"}
    a_rising, a_falling = rising.state_dict().arms[0], falling.state_dict().arms[0]
    assert a_rising.model_dump(exclude=mixture) == a_falling.model_dump(exclude=mixture)


def test_the_state_carries_every_held_out_statistic() -> None:
    """A bandit rebuilt from its saved JSON state continues exactly."""
    b = feed(True)
    again = Bandit.from_state(parse_state(b.state_dict().model_dump_json()), ARMS)
    assert again.state_dict() == b.state_dict()
    for bandit in (b, again):
        for step in range(202, 302):
            heldout = dict.fromkeys("abcd", 1.2) if step == 301 else None
            bandit.observe(step, "abcd"[(step - 1) % 4], 5.5 - 0.001 * step, heldout)
    assert again.probabilities() == b.probabilities()
    assert again.state_dict() == b.state_dict()


def test_a_random_arm_stays_out_with_evaluations() -> None:
    """Random bytes rise while the model trains on text (their held-out loss too), but their
    held-out loss never went below the untrained model's: there is nothing to forget."""
    trained = run({**TEXT3, "random": "random"}, Policy(reward="gated-heldout"), 1500, 5, 100)
    assert second_half_share(trained, "random") <= 0.01
