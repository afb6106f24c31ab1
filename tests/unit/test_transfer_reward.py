"""A policy's target and the transfer reward (daemon/mixing/rewards/transfer.py): the parsing of
`target`, and the reward on records computed by hand."""

from __future__ import annotations

import hashlib
import json
import math
import random

import numpy as np
import pytest

from andrea.daemon.mixing import policystore, rewards
from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm, parse_state
from andrea.daemon.mixing.policy import (
    NEW_RUN_REWARD,
    TARGET_REWARD,
    Policy,
    PolicyError,
    differences,
    parse_policy,
    retargeted,
)
from andrea.daemon.mixing.rewards import transfer
from andrea.daemon.mixing.startup import check_against_log
from andrea.protocol import messages
from andrea.protocol.lossentry import LossEntry
from tests.support.bandit import drive

# ------------------------------------------------------------------------------------- parsing


def test_a_target_is_a_list_or_a_table_and_names_the_transfer_reward() -> None:
    listed = parse_policy('target = ["code", "docs=0.5"]\n')
    table = parse_policy("[target]\ncode = 1\ndocs = 0.5\n")
    assert listed == table and listed.fingerprint() == table.fingerprint()
    assert listed.target == {"code": 1.0, "docs": 0.5}
    assert listed.reward == TARGET_REWARD == "transfer-2" and listed.names_reward
    assert listed.target_weights() == {"code": 2 / 3, "docs": 1 / 3}
    assert parse_policy('reward = "transfer"\ntarget = ["code"]\n').target == {"code": 1.0}


def test_a_policy_without_a_target_keeps_its_bytes_and_fingerprint() -> None:
    plain = parse_policy('reward = "gated-heldout"\n[arms.code]\nfloor = 0.1\n')
    assert "target" not in plain.model_dump_json()
    # The fingerprint as it was computed before targets existed: the canonical JSON of these keys.
    before = {
        "alpha": 0.9,
        "arms": {"code": {"cap": 1.0, "floor": 0.1}},
        "initial_weights": {},
        "lag": 8,
        "reward": "gated-heldout",
    }
    text = json.dumps(before, sort_keys=True, separators=(",", ":"))
    assert plain.fingerprint() == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('target = ["code", "code=2"]', "arm 'code' is named twice"),
        ('target = ["code=x"]', "the weight 'x' is not a number"),
        ('target = ["code=0"]', r"target code=0.0: weights are relative"),
        ('target = ["code=nan"]', "target.code"),
        ("target = []", "an empty target names no arm"),
        ("target = [3]", 'each item is "ARM" or "ARM=W", got 3'),
        ('target = ["c de"]', "arm name 'c de' does not match"),
        (
            'reward = "loss"\ntarget = ["code"]',
            r"served by a reward that serves one \('transfer', 'transfer-2'\), not 'loss'",
        ),
        ('reward = "transfer"', "reward 'transfer' needs a target"),
        ('reward = "transfer-2"', "reward 'transfer-2' needs a target"),
    ],
)
def test_a_bad_target_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(text + "\n", "p.toml")


def test_a_pivot_to_a_target_keeps_the_caps_and_floors() -> None:
    """What `andreactl pivot --target ARM[=W]...` sends: the policy in force, retargeted."""
    base = parse_policy('reward = "gated-heldout"\nlag = 4\n[arms.code]\ncap = 0.5\n')
    polish = retargeted(base, ["docstrings", "code=0.25"])
    assert polish.reward == "transfer-2" and polish.target == {"docstrings": 1.0, "code": 0.25}
    assert (polish.arms, polish.lag) == (base.arms, base.lag)
    assert differences(base, polish) == [
        "reward: gated-heldout → transfer-2",
        "target: none → code=0.25, docstrings",
    ]
    with pytest.raises(PolicyError, match="invalid --target.*'code=-1'|weights are relative"):
        retargeted(base, ["code=-1"])


def test_a_target_arm_the_run_lacks_is_refused_naming_it() -> None:
    policy = parse_policy('target = ["code", "kode=0.5"]\n')
    with pytest.raises(PolicyError, match=r"target names arms this run does not have: kode \("):
        policy.check_arms(["code", "comments", "docstrings"])
    policy.check_arms(["code", "kode"])


def test_a_policy_without_target_or_reward_after_a_target_gets_the_default() -> None:
    # A pivot away from a target by a file that names neither: the reward of new runs, not a
    # transfer reward without a target.
    plain = parse_policy("[arms.code]\nfloor = 0.1\n")
    named, text = policystore.with_reward(plain, "[arms.code]\nfloor = 0.1\n", "transfer")
    assert named.reward == NEW_RUN_REWARD and text.startswith(f'reward = "{NEW_RUN_REWARD}"')


def test_the_wire_leaves_out_what_is_not_asked_for() -> None:
    a = messages.Assignment(step=4, arm="code", phase=0)
    assert "probe" not in a.model_dump_json()
    b = messages.Assignment(step=4, arm="code", phase=0, probe=["code"])
    assert json.loads(b.model_dump_json())["probe"] == ["code"]
    fields = dict(
        step=4, loss=2.0, arm="code", lr=1e-3, tokens=512, wall_time=1.0, segment=1, phase=0
    )
    entry = LossEntry(**fields, batch_sha256=None)
    assert "probe" not in entry.model_dump_json()
    probed = LossEntry(**fields, batch_sha256=None, probe={"code": 2.5})
    assert LossEntry.model_validate_json(probed.model_dump_json()).probe == {"code": 2.5}


# ------------------------------------------------------------------------------ the reward


def test_the_target_probe_is_the_weighted_mean_of_its_arms() -> None:
    target = {"x": 0.75, "y": 0.25}
    assert transfer.target_probe({"x": 2.0, "y": 4.0}, target) == 2.5
    # An arm the probe lacks (no held-out data) is left out and the weights renormalised.
    assert transfer.target_probe({"x": 2.0, "z": 9.0}, target) == 2.0
    assert transfer.target_probe({"z": 9.0}, target) is None
    assert transfer.target_probe({"x": math.nan, "y": 1.0}, target) is None


def test_the_statistics_on_records_computed_by_hand() -> None:
    """Steps a, a (probe 3.0), b, b (probe 2.9), with the moment filter 0.9."""
    stats = transfer.TransferStats.fresh(["b", "a"])
    assert stats.arms == ["a", "b"]
    target = {"a": 1.0}
    transfer.observe(stats, "a", None, target)
    assert stats.exposure == pytest.approx([0.1, 0.0], abs=1e-15)
    assert stats.window == stats.exposure
    transfer.observe(stats, "a", {"a": 3.0}, target)
    # The first probe closes no interval: it starts one.
    assert stats.exposure == pytest.approx([0.19, 0.0], abs=1e-15)
    assert stats.window == [0.0, 0.0] and stats.last_probe == 3.0 and stats.intervals == 0
    transfer.observe(stats, "b", None, target)
    transfer.observe(stats, "b", {"a": 2.9}, target)
    xa, xb = 0.171 + 0.1539, 0.1 + 0.19  # a fades, b is trained twice
    assert stats.intervals == 1 and stats.last_probe == 2.9
    assert stats.moment == pytest.approx([xa * -0.1, xb * -0.1], rel=1e-12)
    assert stats.gram[0] == pytest.approx([xa * xa, xa * xb], rel=1e-12)
    assert stats.gram[1] == pytest.approx([xb * xa, xb * xb], rel=1e-12)
    # beta = (G + ridge I)^-1 m, the 2x2 inverse written out.
    r = transfer.RIDGE
    g11, g12, g22 = xa * xa + r, xa * xb, xb * xb + r
    det = g11 * g22 - g12 * g12
    m1, m2 = -0.1 * xa, -0.1 * xb
    want = {"a": (g22 * m1 - g12 * m2) / det, "b": (g11 * m2 - g12 * m1) / det}
    assert transfer.effects(stats, ["a", "b"]) == pytest.approx(want, rel=1e-9)
    # A second interval: the first is weighted by FORGET against it.
    transfer.observe(stats, "a", {"a": 2.95}, target)
    ya, yb = 0.9 * 0.1539 + 0.1, 0.9 * 0.19
    assert stats.intervals == 2 and stats.last_probe == 2.95
    assert stats.moment == pytest.approx(
        [transfer.FORGET * -0.1 * xa + ya * 0.05, transfer.FORGET * -0.1 * xb + yb * 0.05],
        rel=1e-9,
    )


def run_intervals(
    effect: dict[str, float], shares: list[float], steps: int
) -> transfer.TransferStats:
    """Train the arms of `effect` drawn with `shares` (a fixed generator), probed every
    PROBE_EVERY steps, the target's probe moving by each arm's `effect` as AdamW's first moment
    spreads a step's gradient over the next steps (the model the reward fits)."""
    stats = transfer.TransferStats.fresh(list(effect))
    loss = 3.0
    moment = dict.fromkeys(effect, 0.0)
    draws = random.Random(0).choices(list(effect), shares, k=steps)
    for s, arm in enumerate(draws, 1):
        for n in moment:
            moment[n] = 0.9 * moment[n] + (0.1 if n == arm else 0.0)
        loss += math.fsum(effect[n] * moment[n] for n in effect)
        probe = {"t": loss} if s % transfer.PROBE_EVERY == 0 else None
        transfer.observe(stats, arm, probe, {"t": 1.0})
    return stats


def test_an_arm_that_helps_the_target_gets_a_share_and_one_that_hurts_none() -> None:
    effect = {"t": -0.01, "helper": -0.008, "foreign": 0.004}
    stats = run_intervals(effect, [0.4, 0.4, 0.2], 400)
    beta = transfer.effects(stats, ["foreign", "helper", "t"])
    assert beta["t"] < beta["helper"] < 0 < beta["foreign"]
    shares = transfer.shares(stats, ["foreign", "helper", "t"], {"t": 1.0})
    assert shares[0] == 0.0 and shares[1] == shares[2] == 0.5
    # Exploration: none for a non-target arm before EXPLORE_AFTER steps, eps_t / K after.
    early = transfer.weights(stats, ["foreign", "helper", "t"], {"t": 1.0}, 50)
    assert early[0] < 1e-11
    late = transfer.weights(stats, ["foreign", "helper", "t"], {"t": 1.0}, 400)
    from andrea.daemon.mixing.reward import exploration_rate

    assert late[0] == pytest.approx(exploration_rate(3, 400) / 3, rel=1e-9)


def test_transfer_2_never_lowers_a_target_arm_below_its_weight() -> None:
    """A target arm whose probe shows no effect: "transfer" gives it nothing, "transfer-2" a full
    share (equal weights) or its weight over the heaviest's (0.5 here); an arm the evidence
    raises keeps its full share, a non-target arm without gain stays at none."""
    effect = {"t": -0.01, "u": 0.0, "foreign": 0.004}
    stats = run_intervals(effect, [0.4, 0.4, 0.2], 400)
    live = ["foreign", "t", "u"]
    equal = {"t": 1.0, "u": 1.0}
    assert transfer.shares(stats, live, equal)[2] < 0.1
    assert transfer.shares(stats, live, equal, 1.0).tolist() == [0.0, 0.5, 0.5]
    light = transfer.shares(stats, live, {"t": 1.0, "u": 0.5}, 1.0).tolist()
    assert light == pytest.approx([0.0, 1 / 1.5, 0.5 / 1.5], abs=1e-15)
    # No target arm live (its source gone): no arm is kept up, the gate alone decides.
    gone = ["foreign", "t"]
    assert transfer.shares(stats, gone, {"u": 1.0}, 1.0).tolist() == [0.0, 1.0]
    assert rewards.lookup("transfer").target_floor == 0.0
    assert rewards.lookup("transfer-2").target_floor == 1.0
    # In the bandit (tests/support/bandit.py's probe: "a" helps 0.004 a step, "b" 0.001, "c"
    # hurts): "transfer" gives the target arm "b" less than a full share, "transfer-2" a full one.
    shares = {}
    for reward in ("transfer", "transfer-2"):
        policy = parse_policy(f'reward = "{reward}"\ntarget = ["a", "b"]\nlag = 2\n')
        bandit = Bandit(ARMS, policy, seed=1)
        drive(bandit, 1, 300, {})
        shares[reward] = bandit.rewards()
    assert shares["transfer"]["b"] < 0.45 < 0.55 < shares["transfer"]["a"]
    assert shares["transfer-2"] == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.0}, abs=1e-12)


def test_before_the_evidence_the_target_weights_mix() -> None:
    stats = transfer.TransferStats.fresh(["a", "b", "c"])
    w = transfer.weights(stats, ["a", "b", "c"], {"a": 0.75, "b": 0.25}, 0)
    eps = 1 / 3 / 3  # eps_0 / K for each target arm
    assert w[0] == pytest.approx((1 - 2 * eps) * 0.75 + eps, rel=1e-9)
    assert w[1] == pytest.approx((1 - 2 * eps) * 0.25 + eps, rel=1e-9)
    assert w[2] < 1e-11 and math.fsum(w) == pytest.approx(1.0, abs=1e-15)


# ----------------------------------------------------------------------- in the bandit


ARMS = [ConfiguredArm(n, f"id-{n}", True) for n in ("a", "b", "c")]


def test_the_bandit_asks_for_probes_of_the_target_every_few_steps() -> None:
    b = Bandit(ARMS, parse_policy('target = ["b", "a=2"]\nlag = 2\n'), seed=1, start_step=10)
    asked = {s: b.probe_arms(s) for s in range(11, 11 + 2 * transfer.PROBE_EVERY)}
    assert asked[10 + transfer.PROBE_EVERY] == ["a", "b"]
    assert sum(v is not None for v in asked.values()) == 2
    assert Bandit(ARMS, Policy(reward="gated-heldout"), seed=1).probe_arms(4) is None


def test_the_state_carries_the_probes_and_the_replay_checks_them() -> None:
    """A state written under the transfer reward holds its statistics; the restart's replay of
    the log finds one that the log does not give."""
    policy = parse_policy('target = ["a", "b=0.5"]\nlag = 2\n')
    book = AssignmentBook(Bandit(ARMS, policy, seed=3), ARMS)
    entries = []
    loss = 3.0
    for s in range(1, 101):
        arm = book.assign(s)
        assert arm is not None
        loss += {"a": -0.01, "b": -0.002, "c": 0.003}[arm]
        probe = {"a": loss, "b": loss + 0.5} if book.bandit.probe_arms(s) else None
        book.record(s, arm, 2.0, 0, None, probe)
        fields = dict(lr=1e-3, tokens=8, wall_time=1.0, segment=1, phase=0)
        entries.append(
            LossEntry(step=s, loss=2.0, arm=arm, batch_sha256=None, probe=probe, **fields)
        )
    book.incorporate(98)
    state = parse_state(book.bandit.state_dict().model_dump_json())
    assert state.transfer is not None and state.transfer.intervals >= 10
    assert {e.arm for e in entries} == {"a", "b"}
    check_against_log(state, entries, {0: 0})
    resumed = Bandit.from_state(state, ARMS)
    assert resumed.probabilities() == book.bandit.probabilities()
    edited = state.model_copy(
        update={"transfer": state.transfer.model_copy(update={"last_probe": 9.0})}
    )
    with pytest.raises(ValueError, match="transfer statistics are not what replaying"):
        check_against_log(edited, entries, {0: 0})
    assert np.isfinite(list(resumed.rewards().values())).all()
