"""The bandit's rewards: the learnability reward's statistics by hand, what it does with an arm that
cannot be learned and with one learnt to its floor (fed losses shaped like andrea-tiny's), the
choice of reward in the policy, and the state's format versions."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.bandit import Bandit, BanditStateError, ConfiguredArm, parse_state
from andrea.daemon.mixing.policy import LEARNABILITY_REWARDS, NEW_RUN_REWARD, Policy, parse_policy
from andrea.daemon.mixing.policystore import resolve_policy, store, with_reward
from andrea.daemon.mixing.reward import (
    GATE,
    LEVEL_DECAY,
    PROGRESS_DECAY,
    ArmStats,
    exploration_rate,
    gated_shares,
    gated_weights,
    measuring_shares,
    measuring_weights,
    progress_shares,
)
from andrea.daemon.rundir.layout import POLICY_FILE, STATE_FILE
from tests.support.bandit import TEXT3, drive, run, second_half_share, seed_state

# ------------------------------------------------------------------------------ the statistics


def test_learnability_statistics_by_hand() -> None:
    s = ArmStats()
    steps = [3, 4, 10, 11, 40, 41]
    losses = [5.0, 4.0, 4.5, 3.0, 6.0, 2.0]
    m = b = None
    drops: list[tuple[int, float]] = []  # (step, drop) of every step after the first
    fruitless = 0
    for step, x in zip(steps, losses):
        reward.observe(s, step, x, alpha=0.9)
        if m is None:
            m = b = x
        else:
            m = LEVEL_DECAY * m + (1 - LEVEL_DECAY) * x
            drops.append((step, max(0.0, b - m)))
            fruitless = 0 if b > m else fruitless + 1
            b = min(b, m)
        assert (s.loss_ema, s.loss_best, s.last_pull) == (m, b, step)
        assert s.fruitless == fruitless
    # rho: the mean drop per step, each weighted by PROGRESS_DECAY ** (steps since it).
    weights = [PROGRESS_DECAY ** (steps[-1] - st) for st, _ in drops]
    expected = sum(w * d for w, (_, d) in zip(weights, drops)) / sum(weights)
    assert s.progress == pytest.approx(expected, rel=1e-12)
    # The loss reward's R_i is kept alongside, as ODM computes it.
    r = 0.0
    for x in losses:
        r = 0.9 * r + (1 - 0.9) * math.exp(x)
    assert s.ema_reward == r


def test_a_rise_and_its_recovery_earn_nothing() -> None:
    """Forgetting and re-learning (the loss back to a level it had) is not progress."""
    s = ArmStats()
    for step, x in enumerate([5.55] * 5 + [6.5] * 10 + [5.6] * 40, 1):
        reward.observe(s, 7 * step, x, alpha=0.9)
    assert s.progress == 0.0
    assert s.loss_best == 5.55


def test_progress_shares() -> None:
    # Unmeasured arms (fewer than WARMUP_PULLS steps) count as the best measured one.
    shares = progress_shares([0.02, 0.0, 0.0], [10, 10, 0])
    assert shares.tolist() == [0.5, 0.0, 0.5]
    # Nothing makes progress: uniform.
    assert progress_shares([0.0, 0.0], [10, 10]).tolist() == [0.5, 0.5]
    # Scale-free: the same shares whatever the unit or rate of learning.
    a = progress_shares([3e-3, 1e-3, 0.0], [9, 9, 9])
    assert np.allclose(a, progress_shares([3e-6, 1e-6, 0.0], [9, 9, 9]), rtol=1e-12)
    assert np.allclose(a, [0.75, 0.25, 0.0])


def test_gated_shares() -> None:
    # Every arm at GATE of the best arm's progress or above gets one full share; below, less in
    # proportion; none, nothing.
    top = 0.004
    shares = gated_shares([top, 0.9 * top, GATE * top, GATE * top / 4, 0.0], [20] * 5)
    assert np.allclose(shares, np.array([1, 1, 1, 0.25, 0]) / 3.25, rtol=1e-12, atol=0)
    # Unmeasured arms count as the best; nothing measured or no progress anywhere: uniform.
    assert gated_shares([0.001, 0.0, 0.0], [10, 10, 2]).tolist() == [0.5, 0.0, 0.5]
    assert gated_shares([0.0, 0.0, 0.0], [10, 10, 10]).tolist() == [1 / 3] * 3
    # Scale-free, as the proportional shares are.
    assert np.allclose(
        gated_shares([3e-3, 1e-3, 0.0], [9] * 3), gated_shares([3e-6, 1e-6, 0.0], [9] * 3)
    )


def test_gated_weights_explore_eps_over_k() -> None:
    k, t = 4, 300
    w = gated_weights([0.003, 0.003, 0.003, 0.0], [80] * 4, t)
    eps = exploration_rate(k, t) / k
    assert w.sum() == pytest.approx(1.0, abs=1e-15)
    assert w[3] == eps and np.allclose(w[:3], (1 - k * eps) / 3 + eps)
    # Arms that all learn alike are mixed exactly as a uniform mixture.
    assert np.allclose(gated_weights([0.003, 0.002, 0.0025], [80] * 3, t), 1 / 3, rtol=1e-15)


def test_measuring_shares() -> None:
    # Measured arms (MEASURE_PULLS losses known) are gated as under gated-learnability; an arm
    # still short of its measurement counting its pending steps gets a full share; an arm whose
    # measurement is under way (enough steps assigned, losses not known yet) gets none.
    top = 0.004
    shares = measuring_shares(
        [top, GATE * top / 2, 0.0, 0.0, 0.0], [9, 9, 1, 1, 0], [0, 0, 0, 1, 1]
    )
    assert np.allclose(shares, np.array([1, 0.5, 1, 0, 1]) / 3.5, rtol=1e-12, atol=0)
    # Before any loss is known, the policy's initial weights rank the arms still to measure.
    ranked = measuring_shares([0.0] * 3, [0] * 3, [0, 2, 1], [2.0, 5.0, 6.0])
    assert ranked.tolist() == [0.25, 0.0, 0.75]
    # Every measurement under way and none done: nothing is known, uniform.
    assert measuring_shares([0.0] * 3, [0, 1, 1], [2, 1, 3]).tolist() == [1 / 3] * 3
    # Measured arms that all stopped progressing share alike.
    assert measuring_shares([0.0, 0.0, 0.0], [9, 9, 0], [0, 0, 2]).tolist() == [0.5, 0.5, 0.0]


def test_measuring_weights_explore_less_an_arm_whose_steps_bring_nothing() -> None:
    # Exploration eps_t / K per arm, divided by 1 + the arm's steps since its last new low: an
    # arm trained 9 times in vain is explored a tenth as much as one still setting lows.
    k, t = 4, 300
    w = measuring_weights([0.003, 0.003, 0.003, 0.0], [80] * 4, [0] * 4, [0, 2, 0, 9], t)
    e = exploration_rate(k, t) / k * np.array([1, 1 / 3, 1, 1 / 10])
    assert w.sum() == pytest.approx(1.0, abs=1e-15)
    assert w[3] == pytest.approx(e[3], rel=1e-15)
    assert np.allclose(w[:3], (1 - e.sum()) / 3 + e[:3], rtol=1e-15)


def test_an_arm_under_measurement_draws_only_its_exploration() -> None:
    arms = [ConfiguredArm(n, n, True) for n in "abc"]
    b = Bandit(arms, Policy(reward="gated-learnability-2"), seed=0)
    eps = exploration_rate(3, 0) / 3
    p = b.probabilities(["a", "b", "a"])
    assert p["a"] == eps and p["b"] == p["c"] == (1 - 3 * eps) / 2 + eps
    assert sum(p.values()) == pytest.approx(1.0, abs=1e-15)
    # Bounds still hold exactly: a floor keeps the arm at it even while it waits.
    floored = Bandit(
        arms, Policy(reward="gated-learnability-2", arms={"a": {"floor": 0.3}}), seed=0
    )
    assert floored.probabilities(["a", "a"])["a"] == 0.3
    # The other rewards ignore pending steps.
    plain = Bandit(arms, Policy(reward="gated-learnability"), seed=0)
    assert plain.probabilities(["a", "a"]) == plain.probabilities()


def test_a_zombie_never_draws_while_a_new_arm_is_measured() -> None:
    arms = [ConfiguredArm(n, n, True) for n in "abc"]
    b = Bandit(arms, Policy(reward="gated-learnability-2", lag=2), seed=0)
    for s, arm in enumerate("abcabc", 1):
        b.observe(s, arm, 3.0 - s / 10)
    # "a" goes away and "d" joins: d is measured first (the pending steps count), a never draws,
    # even where a step still pending had been assigned to it.
    now = [ConfiguredArm("a", "a", False), *arms[1:], ConfiguredArm("d", "d", True)]
    b2 = Bandit.from_state(b.state_dict(), now)
    p = b2.probabilities(["a"])
    assert p["a"] == 0.0 and p["d"] >= p["b"] > 0.0 and p["d"] >= p["c"] > 0.0
    drawn = drive(b2, 8, 300, {7: "a"})
    assert "a" not in set(drawn.values()) - {drawn[7]}
    assert [drawn[s] for s in range(8, 20)].count("d") >= 2


# ------------------------------------------------------------------------ losses like a trainer's


#: What each learnability reward divides eps_t by to explore one arm.
EXPLORED_SHARE = {
    "learnability": 1,
    "gated-learnability": 4,
    "gated-learnability-2": 4,
    "gated-heldout": 4,
    "gated-fall": 4,
    "gated-plateau": 4,
}


@functools.cache
def _trained(
    kinds: tuple[tuple[str, str], ...], kind: str, steps: int, seed: int = 5
) -> tuple[str, ...]:
    """`run` under the policy of reward `kind` alone, once per module: several tests read the same
    deterministic runs (the loss reward's negative control, seed 5 of each reward)."""
    return tuple(run(dict(kinds), Policy(reward=kind), steps, seed))


UNLEARNABLE = (*TEXT3.items(), ("random", "random"))


@pytest.mark.parametrize("kind", LEARNABILITY_REWARDS)
def test_an_unlearnable_arm_stays_at_its_floor_plus_exploration(kind: str) -> None:
    kinds = {**TEXT3, "random": "random"}
    steps = 1500
    trained = _trained(UNLEARNABLE, kind, steps, 5)
    # Exploration alone over the second half: eps_t is at most 0.0215 there (a quarter of it
    # under the gated rewards, which explore eps_t / K, less as the arm's steps bring nothing).
    explore = exploration_rate(4, steps // 2) / EXPLORED_SHARE[kind]
    assert second_half_share(trained, "random") <= explore + 0.01
    with_floor = run(kinds, Policy(reward=kind, arms={"random": {"floor": 0.1}}), steps)
    assert 0.1 <= second_half_share(with_floor, "random") <= 0.1 + 0.04
    # The negative control: ODM's reward feeds the arm it cannot learn.
    assert second_half_share(_trained(UNLEARNABLE, "loss", steps, 5), "random") > 0.5


def test_gated_learnability_2_spends_fewer_steps_on_an_unlearnable_arm() -> None:
    """gated-learnability trains an arm it has not measured as if it were the best until its third
    loss is known, W = 8 steps late, and explores it eps_t / K for the rest of the run;
    gated-learnability-2 stops at the two steps its measurement needs, counting the steps assigned
    whose losses are not known yet, and explores it less with each step that brings nothing."""
    kinds = {**TEXT3, "random": "random"}
    rewards = ("gated-learnability", "gated-learnability-2")
    first_40 = {
        kind: np.mean(
            [run(kinds, Policy(reward=kind), 40, seed).count("random") for seed in range(20)]
        )
        for kind in rewards
    }
    # 2 measuring steps, plus what the first losses (all 4 arms unmeasured) and exploration add.
    assert first_40["gated-learnability-2"] <= 4.0
    assert first_40["gated-learnability"] >= first_40["gated-learnability-2"] + 2.0
    whole = {
        kind: np.mean(
            [_trained(UNLEARNABLE, kind, 1500, seed).count("random") for seed in range(6)]
        )
        for kind in rewards
    }
    assert whole["gated-learnability-2"] <= whole["gated-learnability"] / 2


@pytest.mark.parametrize("kind", LEARNABILITY_REWARDS)
def test_an_arm_learnt_to_its_floor_gives_way(kind: str) -> None:
    trained = run({**TEXT3, "dup": "dup"}, Policy(reward=kind), 1500)
    # While it is being learnt it makes the most progress: the proportional reward gives it more
    # than a quarter of the steps, the gated one a full share. Once its loss stops setting new
    # lows its share falls below uniform's.
    assert trained[100:500].count("dup") / 400 > (0.3 if kind == "learnability" else 0.2)
    # The gate keeps a full share for an arm whose lows, noise-made, still come half as fast as
    # the learnable arms' slow ones: it gives way less than the proportional reward does.
    # gated-fall gives the sentence its share back whenever the model forgets it in earnest (this
    # learner forgets 0.5 nats of it in a few hundred idle steps): it stays below uniform's.
    bound = {"learnability": 0.16, "gated-fall": 0.25}.get(kind, 0.2)
    assert second_half_share(trained, "dup") <= bound


@pytest.mark.parametrize(
    ("kind", "spread"),
    [("learnability", 0.09), ("gated-learnability", 0.05), ("gated-learnability-2", 0.05)],
)
def test_learnable_arms_share_alike(kind: str, spread: float) -> None:
    trained = run(TEXT3, Policy(reward=kind), 1500)
    for arm in TEXT3:
        assert abs(second_half_share(trained, arm) - 1 / 3) <= spread


# -------------------------------------------------------------------------- the state's versions


def test_a_version_1_state_continues_under_the_loss_reward() -> None:
    state = parse_state(seed_state())
    assert state.version == 1 and state.policy.reward == "loss"
    configured = [ConfiguredArm(n, f"id-{n}", True) for n in ("code", "comments")]
    configured.append(ConfiguredArm("repo-docstrings", "id-repo", True))
    b = Bandit.from_state(state, configured)
    again = b.state_dict()
    assert again.version == 2 and again.policy.fingerprint() == state.policy_fingerprint
    # The loss statistics start at the next step of each arm; R_i carries on.
    assert b.rewards()["code"] == 40.0
    b.observe(112620, "code", 3.0)
    report = b.reward_report()
    assert report.kind == "loss" and report.arms["code"].loss == 3.0
    assert report.arms["comments"].loss is None
    assert b.rewards()["code"] == 0.9 * 40.0 + (1 - 0.9) * math.exp(3.0)


def test_a_version_1_state_cannot_claim_the_learnability_reward() -> None:
    d = json.loads(seed_state())
    policy = Policy(
        reward="learnability", **{k: v for k, v in d["policy"].items() if k != "reward"}
    )
    d["policy"], d["policy_fingerprint"] = policy.model_dump(mode="json"), policy.fingerprint()
    with pytest.raises(BanditStateError, match="version 1 state has the 'loss' reward"):
        parse_state(json.dumps(d))
    d["version"] = 2
    with pytest.raises(BanditStateError, match="loss_ema must be present exactly when pulls > 0"):
        parse_state(json.dumps(d))


@pytest.mark.parametrize("field,value,message", [
    ("loss_best", 9.0, "loss_best 9.0 is above loss_ema"),
    ("loss_ema", None, "loss_ema and loss_best come together"),
    ("progress_sum", -1.0, "progress_sum"),
    ("last_pull", 99, "last_pull 99 is after last_step 4"),
    ("fruitless", -1, "fruitless"),
])  # fmt: skip
def test_bad_learnability_statistics(field: str, value: object, message: str) -> None:
    b = Bandit([ConfiguredArm("a", "a", True), ConfiguredArm("b", "b", True)], Policy(
        reward="learnability", lag=1), seed=0)  # fmt: skip
    for s, arm in enumerate("abab", 1):
        b.observe(s, arm, 3.0 - s / 10)
    d = json.loads(b.state_dict().model_dump_json())
    d["arms"][0][field] = value
    with pytest.raises(BanditStateError, match=message):
        parse_state(json.dumps(d))


def test_a_pivot_starts_the_reward_afresh() -> None:
    policy = Policy(reward="learnability", lag=1)
    arms = [ConfiguredArm("a", "a", True), ConfiguredArm("b", "b", True)]
    old = Bandit(arms, policy, seed=0)
    for s, arm in enumerate("abab", 1):
        old.observe(s, arm, 3.0 - s / 10)
    assert old.reward_report().arms["a"].loss is not None
    new = Bandit(arms, policy, seed=0, phase=old.phase + 1, start_step=old.last_step)
    for arm in new.reward_report().arms.values():
        assert (arm.loss, arm.progress, arm.pulls) == (None, 0.0, 0)


# ------------------------------------------------------------------------- the reward of a run


IMPLICIT_FINGERPRINT = "c2aa11347dc9437b5decb7155fae4ea3181bd69d9a93628e147db57c1cca7440"


def test_a_policy_without_the_key_keeps_its_fingerprint() -> None:
    """The fingerprint of the default policy before the reward could be chosen: states and pivot
    records hold it, and the runs that wrote them must find it unchanged."""
    assert Policy().fingerprint() == IMPLICIT_FINGERPRINT
    assert parse_policy('reward = "loss"\n').fingerprint() == IMPLICIT_FINGERPRINT
    assert Policy(reward="learnability").fingerprint() != IMPLICIT_FINGERPRINT
    assert (
        not parse_policy("lag = 8\n").names_reward and parse_policy('reward = "loss"').names_reward
    )


def test_a_new_run_gets_the_newest_reward_and_its_file_says_so(tmp_path: Path) -> None:
    resolved = resolve_policy(tmp_path, None, False)
    assert resolved.policy.reward == NEW_RUN_REWARD == "gated-plateau"
    assert resolved.write is not None and parse_policy(resolved.write).reward == NEW_RUN_REWARD

    given = tmp_path / "base.toml"
    given.write_text("[arms.code]\ncap = 0.5\n")
    first = resolve_policy(tmp_path, given, False)
    assert first.policy.reward == NEW_RUN_REWARD and first.write is not None
    stored = parse_policy(first.write)
    assert stored.reward == NEW_RUN_REWARD and stored.arms["code"].cap == 0.5
    store(tmp_path, first.write)
    # A restart with the same file (which does not name the reward) keeps the run's.
    again = resolve_policy(tmp_path, given, False)
    assert (again.policy, again.write, again.pivot) == (first.policy, None, False)


def test_a_run_whose_policy_predates_the_choice_keeps_the_loss_reward(tmp_path: Path) -> None:
    """Its policy.toml and its (version 1) state name no reward: it keeps ODM's, and its file is
    written back naming it, with the same fingerprint."""
    old = "[arms.code]\ncap = 0.5\n"
    (tmp_path / POLICY_FILE).write_text(old)
    (tmp_path / STATE_FILE).write_text(json.dumps({"bandit": json.loads(seed_state())}))
    resolved = resolve_policy(tmp_path, None, False)
    assert resolved.policy.reward == "loss"
    assert resolved.policy.fingerprint() == parse_policy(old).fingerprint()
    assert resolved.write is not None and parse_policy(resolved.write).names_reward
    store(tmp_path, resolved.write)
    given = tmp_path / "base.toml"
    given.write_text(old)
    again = resolve_policy(tmp_path, given, False)
    assert again.policy == resolved.policy and again.write is None


def test_a_run_older_than_its_policy_file_keeps_the_loss_reward(tmp_path: Path) -> None:
    """A run whose policy is only in .state.json (written before policy.toml existed)."""
    (tmp_path / STATE_FILE).write_text(json.dumps({"bandit": json.loads(seed_state())}))
    resolved = resolve_policy(tmp_path, None, False)
    assert resolved.policy.reward == "loss" and resolved.write is not None
    assert parse_policy(resolved.write).reward == "loss"


@pytest.mark.parametrize("older", ["learnability", "gated-learnability"])
def test_a_policy_without_the_key_takes_the_reward_of_the_run(tmp_path: Path, older: str) -> None:
    """A run made when new runs got an earlier learnability reward says so in its state: a
    policy.toml edited without the key (the manual pivot) keeps it, as `andreactl pivot` with
    the same file does; logged steps without any state (a run from before) mean the loss
    reward."""
    state = json.loads(seed_state())
    policy = Policy(reward=older)
    state.update(version=2, policy=policy.model_dump(mode="json"))
    state["policy_fingerprint"] = policy.fingerprint()
    for arm in state["arms"]:
        arm.update(loss_ema=3.0, loss_best=2.9, last_pull=112619)
    (tmp_path / STATE_FILE).write_text(json.dumps({"bandit": state}))
    (tmp_path / POLICY_FILE).write_text("[arms.code]\nfloor = 0.2\n")
    resolved = resolve_policy(tmp_path, None, False)
    assert resolved.policy.reward == older and resolved.write is not None

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / ".loss.json").write_text("[\n]\n")
    assert resolve_policy(bare, None, False).policy.reward == "loss"


def test_a_pivot_policy_without_the_key_keeps_the_run_reward() -> None:
    text = "[arms.code]\nfloor = 0.2\n"
    policy, stored = with_reward(parse_policy(text), text, "learnability")
    assert policy.reward == "learnability" and parse_policy(stored) == policy
    named = 'reward = "loss"\n' + text
    assert with_reward(parse_policy(named), named, "learnability") == (parse_policy(named), named)
