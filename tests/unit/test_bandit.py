"""The mixing bandit and its policy: the math, the bounds, determinism, the lag, zombies, the files."""

from __future__ import annotations

import json
import logging
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from andrea.daemon.mixing import bandit as bandit_mod
from andrea.daemon.mixing import policy as policy_mod
from andrea.daemon.mixing.bandit import (
    Bandit,
    BanditState,
    BanditStateError,
    ConfiguredArm,
    LagError,
    ObservationOrderError,
    draw_uniform,
    parse_state,
    project_capped_simplex,
)
from andrea.daemon.mixing.policy import REWARDS, Policy, PolicyError, load_policy, parse_policy
from andrea.daemon.mixing.reward import exploration_rate
from tests.support.bandit import drive, seed_state, targeted

ROOT = Path(__file__).resolve().parents[2]
ABC = [
    ConfiguredArm("a", "id-a", True),
    ConfiguredArm("b", "id-b", True),
    ConfiguredArm("c", "id-c", True),
]


# ---------------------------------------------------------------------------------------------- math


def test_exploration_rate_values() -> None:
    assert exploration_rate(3, 0) == 1 / 3
    assert exploration_rate(3, 1) == 1 / 3  # sqrt(ln 3 / 3) = 0.605 > 1/3
    assert exploration_rate(3, 3) == 1 / 3  # sqrt(ln 3 / 9) = 0.349 > 1/3
    assert exploration_rate(3, 4) == pytest.approx(math.sqrt(math.log(3) / 12), rel=1e-15)
    assert exploration_rate(2, 100) == pytest.approx(math.sqrt(math.log(2) / 200), rel=1e-15)
    assert exploration_rate(10, 1000) == pytest.approx(0.015174271293851463, rel=1e-12)
    assert exploration_rate(1, 5) == 0.0  # one arm: nothing to explore
    with pytest.raises(ValueError):
        exploration_rate(0, 1)


def _hand_update(obs: list[tuple[str, float]], alpha: float = 0.9) -> dict[str, float]:
    """The ODM mixture computed from the written formula alone, in plain Python."""
    k = 3
    r = {"a": 0.0, "b": 0.0, "c": 0.0}
    for arm, loss in obs:
        r[arm] = alpha * r[arm] + (1 - alpha) * math.exp(loss)
    t = len(obs)

    def eps(n: int) -> float:
        return 1 / k if n == 0 else min(1 / k, math.sqrt(math.log(k) / (k * n)))

    z = {n: math.exp(eps(t - 1) * v) for n, v in r.items()}
    total = sum(z.values())
    return {n: (1 - k * eps(t)) * z[n] / total + eps(t) for n in r}


OBS = [("a", 2.0), ("b", 1.0), ("a", 3.0), ("c", 0.5), ("b", 1.5)]


@pytest.mark.parametrize("t", [1, 3, 4, 5])
def test_hand_computed_update_k3(t: int) -> None:
    b = Bandit(ABC, Policy(lag=1), seed=1)
    for step, (arm, loss) in enumerate(OBS[:t], 1):
        b.observe(step, arm, loss)
    expected = _hand_update(OBS[:t])
    got = b.probabilities()
    for n in "abc":
        assert got[n] == pytest.approx(expected[n], rel=1e-14, abs=0)
    r_a = 0.0
    for arm, loss in OBS[:t]:
        if arm == "a":
            r_a = 0.9 * r_a + 0.1 * math.exp(loss)
    assert b.rewards()["a"] == pytest.approx(r_a, rel=1e-15)
    if t >= 4:  # past K ln K the mixture leaves uniform and favours the hardest arm
        assert got["a"] > got["b"] > 1 / 3 * 0.9


def test_hand_computed_update_with_cap_and_floor_binding() -> None:
    policy = Policy(lag=1, arms={"a": {"cap": 0.34}, "c": {"floor": 0.33}})
    b = Bandit(ABC, policy, seed=1)
    for step, (arm, loss) in enumerate(OBS, 1):
        b.observe(step, arm, loss)
    w = _hand_update(OBS)
    assert w["a"] > 0.34 and w["c"] < 0.33  # both bounds bind on the raw mixture
    got = b.probabilities()
    assert got == {"a": 0.34, "b": pytest.approx(0.33, abs=1e-15), "c": 0.33}
    assert b.weights() == pytest.approx(w, rel=1e-14)


@pytest.mark.parametrize(
    ("y", "lo", "hi", "expected"),
    [
        # nothing binds: plain normalisation
        ([0.2, 0.3, 0.5], [0, 0, 0], [1, 1, 1], [0.2, 0.3, 0.5]),
        # a cap binds: the excess goes to the others in proportion (0.2 : 0.1)
        ([0.7, 0.2, 0.1], [0, 0, 0], [0.5, 1, 1], [0.5, 1 / 3, 1 / 6]),
        # a floor binds: the others give in proportion
        ([0.9, 0.05, 0.05], [0, 0, 0.2], [1, 1, 1], [0.8 * 0.9 / 0.95, 0.8 * 0.05 / 0.95, 0.2]),
        # both bind
        ([0.8, 0.15, 0.05], [0, 0, 0.2], [0.5, 1, 1], [0.5, 0.3, 0.2]),
        # capping one pushes the next over its cap (a cascade, solved in one go)
        ([0.5, 0.4, 0.1], [0, 0, 0], [0.3, 0.3, 1], [0.3, 0.3, 0.4]),
        # floors that sum to 1 leave no freedom; so do caps
        ([0.6, 0.3, 0.1], [0.2, 0.3, 0.5], [1, 1, 1], [0.2, 0.3, 0.5]),
        ([0.6, 0.3, 0.1], [0, 0, 0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),
        # unnormalised input and a single arm
        ([2.0, 6.0], [0, 0], [1, 1], [0.25, 0.75]),
        ([5.0], [0], [1], [1.0]),
    ],
)
def test_projection_examples(y, lo, hi, expected) -> None:
    p = project_capped_simplex(np.array(y, float), np.array(lo, float), np.array(hi, float))
    assert p.tolist() == pytest.approx(expected, abs=1e-15)
    assert abs(math.fsum(p) - 1.0) <= 1e-12
    assert np.all(p >= np.array(lo)) and np.all(p <= np.array(hi))


def test_projection_when_rounding_picks_the_neighbouring_interval() -> None:
    # g at the knot 1/y[1] evaluates to 1 - 1 ulp, so the search lands one interval too far; the
    # free mass there is 1e-12 and the solution must still put arm 1 at its cap, not at 0.
    y = np.array([1e-12, 152905766.52153066])
    p = project_capped_simplex(y, np.zeros(2), np.array([1.0, 1.0]))
    assert p[1] == pytest.approx(1.0, abs=1e-15) and 0.0 <= p[0] < 1e-15


def test_projection_is_the_kl_projection() -> None:
    # Any other feasible point is farther from y in KL(p || y/sum y).
    rng = np.random.default_rng(0)
    y = np.array([0.5, 0.25, 0.15, 0.1])
    lo, hi = np.array([0.0, 0.0, 0.2, 0.1]), np.array([0.35, 1.0, 1.0, 0.3])
    p = project_capped_simplex(y, lo, hi)

    def kl(q: np.ndarray) -> float:
        return float(np.sum(q * np.log(q / y)))

    for _ in range(2000):
        q = np.clip(p + rng.normal(0, 0.02, 4), lo, hi)
        q[1] = 1.0 - q[[0, 2, 3]].sum()
        if lo[1] <= q[1] <= hi[1]:
            assert kl(q) >= kl(p) - 1e-12


# ------------------------------------------------------------------------------------ properties


@st.composite
def feasible_bounds(draw: st.DrawFn) -> tuple[int, list[float], list[float]]:
    k = draw(st.integers(1, 6))
    unit = st.floats(0.0, 1.0)
    f = [draw(unit) for _ in range(k)]
    scale = draw(unit) / max(1.0, math.fsum(f))
    floors = [x * scale for x in f]
    caps = [fl + draw(unit) * (1.0 - fl) for fl in floors]
    deficit = 1.0 - math.fsum(caps)
    for i in range(k):  # raise caps until they can hold a full unit of probability
        if deficit <= 0:
            break
        add = min(1.0 - caps[i], deficit)
        caps[i] += add
        deficit -= add
    return k, floors, caps


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_projection_property(data) -> None:
    k, floors, caps = data.draw(feasible_bounds())
    y = np.array(data.draw(st.lists(st.floats(1e-12, 1e12), min_size=k, max_size=k)))
    lo, hi = np.array(floors), np.array(caps)
    p = project_capped_simplex(y, lo, hi)
    assert np.all(p >= lo) and np.all(p <= hi)
    assert abs(math.fsum(p) - 1.0) <= 1e-12
    # Free arms keep the ratios of y.
    free = (p > lo) & (p < hi)
    if free.sum() >= 2:
        ratio = p[free] / y[free]
        assert np.allclose(ratio, ratio[0], rtol=1e-9)


losses = st.one_of(
    st.floats(-1e6, 1e308, allow_nan=False, allow_infinity=False),
    st.floats(0.0, 20.0),
    st.sampled_from([0.0, 1e-300, 5e-324, 709.0, 710.0, 1e300, -1e300]),
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounds=feasible_bounds(), data=st.data())
def test_bounds_hold_after_every_update(bounds, data) -> None:
    k, floors, caps = bounds
    names = [f"arm{i}" for i in range(k)]
    # A zombie with a big floor must not count against feasibility.
    reward = data.draw(st.sampled_from(REWARDS))
    policy = Policy(
        reward=reward,
        lag=1,
        alpha=data.draw(st.floats(0.0, 0.99)),
        arms={n: {"floor": fl, "cap": c} for n, fl, c in zip(names, floors, caps)},
        **targeted(reward, names[0]),
    )
    arms = [ConfiguredArm(n, n, True) for n in names] + [ConfiguredArm("gone", "x", False)]
    b = Bandit(arms, policy, seed=data.draw(st.integers(0, 2**63 - 1)))
    seq = data.draw(st.lists(st.tuples(st.integers(0, k - 1), losses), min_size=1, max_size=40))
    for step, (i, loss) in enumerate(seq, 1):
        b.observe(step, names[i], loss)
        p = b.probabilities()
        assert p["gone"] == 0.0
        vals = [p[n] for n in names]
        assert all(math.isfinite(v) for v in vals)
        assert all(fl <= v <= c for v, fl, c in zip(vals, floors, caps)), (vals, floors, caps)
        assert abs(math.fsum(vals) - 1.0) <= 1e-12
        assert all(math.isfinite(r) for r in b.rewards().values())
        assert b.draw(step + 1) in names


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6))
def test_infeasible_floors_always_rejected(floors) -> None:
    assume(math.fsum(floors) > 1.0 + 1e-9)
    arms = {f"a{i}": {"floor": f, "cap": 1.0} for i, f in enumerate(floors)}
    with pytest.raises(ValidationError, match="floors sum to"):
        Policy(arms=arms)


def test_feasibility_edges() -> None:
    Policy(arms={f"a{i}": {"floor": 0.1} for i in range(10)})  # sums to 0.9999999999999999
    with pytest.raises(ValidationError, match="floors sum to"):
        Policy(arms={"a": {"floor": 0.5}, "b": {"floor": 0.5 + 2e-12}})
    exact = Policy(arms={"a": {"cap": 0.25}, "b": {"cap": 0.75}})
    assert Bandit([("a", "a", True), ("b", "b", True)], exact, seed=0).probabilities() == {
        "a": 0.25,
        "b": 0.75,
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6))
def test_infeasible_caps_always_rejected(caps) -> None:
    total = math.fsum(caps)
    if total >= 1.0 - 1e-9:
        caps = [c * (0.9 / total) for c in caps]
    names = [f"a{i}" for i in range(len(caps))]
    policy = Policy(arms={n: {"cap": c} for n, c in zip(names, caps)})
    with pytest.raises(PolicyError, match=r"caps of the live arms sum to .* < 1"):
        Bandit([ConfiguredArm(n, n, True) for n in names], policy, seed=0)
    # One more live arm with the default cap of 1 makes the same policy feasible.
    Bandit([ConfiguredArm(n, n, True) for n in [*names, "extra"]], policy, seed=0)


def test_floors_of_zombies_do_not_count() -> None:
    policy = Policy(arms={"a": {"floor": 0.6}, "b": {"floor": 0.3}, "c": {"cap": 0.05}})
    b = Bandit([("a", "ia", True), ("b", "ib", False), ("c", "ic", True)], policy, seed=0)
    assert b.probabilities() == {"a": 0.95, "b": 0.0, "c": 0.05}


def test_huge_and_tiny_losses_stay_finite() -> None:
    b = Bandit(ABC, Policy(lag=1, arms={"a": {"cap": 0.5}}), seed=3)
    for step, (arm, loss) in enumerate(
        [("a", 1e300), ("b", 710.0), ("c", -1e300), ("a", 5e-324)] * 5, 1
    ):
        b.observe(step, arm, loss)
    assert all(math.isfinite(v) for v in b.rewards().values())
    p = b.probabilities()
    assert p["a"] <= 0.5 and p["b"] == max(p.values()) and abs(math.fsum(p.values()) - 1) <= 1e-12
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="not finite"):
            b.observe(21, "a", bad)


# -------------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("reward", REWARDS)
def test_same_inputs_same_arm_sequence(reward: str) -> None:
    policy = Policy(
        reward=reward, lag=4, arms={"c": {"floor": 0.1}, "a": {"cap": 0.6}}, **targeted(reward, "a")
    )
    one = drive(Bandit(ABC, policy, seed=42), 1, 300, {})
    # Configuration order does not matter either.
    two = drive(Bandit(list(reversed(ABC)), policy, seed=42), 1, 300, {})
    assert one == two
    other_seed = drive(Bandit(ABC, policy, seed=43), 1, 300, {})
    assert other_seed != one
    assert set(one.values()) == {"a", "b", "c"}


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("k", [0, 3, 4, 57, 200])
def test_restart_from_state_continues_bit_for_bit(k: int, reward: str) -> None:
    policy = Policy(
        reward=reward,
        lag=4,
        arms={"c": {"floor": 0.1}, "a": {"cap": 0.6}},
        initial_weights={"b": 3.0},
        **targeted(reward, "a", "c"),
    )
    reference = drive(Bandit(ABC, policy, seed=9, phase=2, start_step=100), 101, 400, {})

    first = Bandit(ABC, policy, seed=9, phase=2, start_step=100)
    assigned = drive(first, 101, 100 + k + policy.lag, {})  # incorporated up to step 100 + k
    assert first.last_step == 100 + k
    saved = first.state_dict().model_dump_json()
    resumed = Bandit.from_state(parse_state(saved), ABC)
    assert resumed.probabilities() == first.probabilities()  # exact, not approximate
    assert resumed.state_dict() == first.state_dict()
    assert drive(resumed, 100 + k + policy.lag + 1, 400, assigned) == reference


def test_draw_is_independent_of_call_history() -> None:
    b = Bandit(ABC, Policy(lag=1), seed=5)
    before = [b.draw(s) for s in (7, 3, 1000, 7)]
    assert before[0] == before[3]
    for s in range(1, 200):
        b.draw(s)
    assert [b.draw(s) for s in (7, 3, 1000, 7)] == before
    assert draw_uniform(5, 0, 7) == draw_uniform(5, 0, 7)
    assert (
        len(
            {
                draw_uniform(5, 0, 7),
                draw_uniform(5, 1, 7),
                draw_uniform(6, 0, 7),
                draw_uniform(5, 0, 8),
            }
        )
        == 4
    )
    us = [draw_uniform(1, 0, s) for s in range(20000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert abs(np.mean(us) - 0.5) < 0.01


def test_draw_follows_probabilities() -> None:
    b = Bandit(ABC, Policy(initial_weights={"a": 6.0, "b": 3.0, "c": 1.0}), seed=11)
    counts = {n: 0 for n in "abc"}
    for s in range(1, 20001):
        counts[b.draw(s)] += 1
    assert counts["a"] / 20000 == pytest.approx(0.6, abs=0.015)
    assert counts["c"] / 20000 == pytest.approx(0.1, abs=0.01)


# ------------------------------------------------------------------------------------------ lag


def test_lag_enforced() -> None:
    b = Bandit(ABC, Policy(lag=3), seed=0, start_step=10)
    for s in (11, 12, 13):  # the first W steps of a phase see no loss of it
        b.assign(s)
    with pytest.raises(LagError, match="up to 11"):
        b.assign(14)  # needs step 11's loss
    b.observe(11, "a", 2.0)
    b.assign(14)
    with pytest.raises(LagError, match="already incorporated"):
        b.assign(13)  # would use step 11's loss, which step 13 must not see
    with pytest.raises(LagError):
        b.assign(16)
    with pytest.raises(bandit_mod.BanditError, match="earlier phase"):
        b.draw(10)


def test_observation_order() -> None:
    b = Bandit(ABC, Policy(), seed=0)
    with pytest.raises(ObservationOrderError, match="expected step 1, got 2"):
        b.observe(2, "a", 1.0)
    assert b.observe(1, "a", 1.0) is True
    state = b.state_dict()
    assert b.observe(1, "a", 1.0) is False  # an exact resend changes nothing
    assert b.state_dict() == state
    with pytest.raises(ObservationOrderError, match="already incorporated"):
        b.observe(1, "a", 1.5)
    with pytest.raises(ObservationOrderError):
        b.observe(3, "b", 1.0)
    with pytest.raises(bandit_mod.BanditError, match="unknown arm"):
        b.observe(2, "nope", 1.0)
    # The duplicate check survives a restart.
    again = Bandit.from_state(parse_state(b.state_dict().model_dump_json()), ABC)
    assert again.observe(1, "a", 1.0) is False


def test_counters() -> None:
    b = Bandit(ABC, Policy(lag=1), seed=0, phase=3, start_step=50)
    for s, arm in zip(range(51, 56), "abaca"):
        b.observe(s, arm, 1.0)
    c = b.counters()
    assert (c.phase, c.phase_start_step, c.steps_in_phase, c.total_steps) == (3, 50, 5, 55)
    assert c.pulls == {"a": 3, "b": 1, "c": 1}


# -------------------------------------------------------------------------------------- zombies


def test_zombie_arm_lesson(caplog: pytest.LogCaptureFixture) -> None:
    configured = [
        ConfiguredArm("code", "id-code", True),
        ConfiguredArm("comments", "id-comments", True),
    ]
    with caplog.at_level(logging.WARNING, logger="andrea.daemon.mixing.bandit"):
        b = Bandit.from_state(parse_state(seed_state()), configured)
    # Reported: on the bandit and in the log.
    assert [z.name for z in b.zombies] == ["repo-docstrings"]
    z = b.zombies[0]
    assert (z.reason, z.weight, z.pulls) == ("source not configured", 1.546, 100)
    assert any(
        "repo-docstrings" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
    )
    # Never draws; its floor of 0.5 is not counted.
    p = b.probabilities()
    assert (
        p["repo-docstrings"] == 0.0 and p["code"] >= 0.3 and abs(math.fsum(p.values()) - 1) <= 1e-12
    )
    drawn = drive(
        b, 112620 + b.policy.lag, 114000, {s: "code" for s in range(112620, 112620 + b.policy.lag)}
    )
    assert "repo-docstrings" not in set(drawn.values())
    # Stays in the state with its history.
    kept = {a.name: a for a in b.state_dict().arms}["repo-docstrings"]
    assert (kept.live, kept.weight, kept.pulls, kept.ema_reward) == (False, 1.546, 100, 55.0)
    assert kept.identity == "id-repo"
    assert kept.zombie_reason == "source not configured"
    # ... across further restarts too, and it comes back when its source does.
    again = Bandit.from_state(
        b.state_dict(), [*configured, ConfiguredArm("repo-docstrings", "id-repo", True)]
    )
    assert again.zombies == [] and again.probabilities()["repo-docstrings"] >= 0.5


def test_zombie_reasons_and_new_arms() -> None:
    b = Bandit(ABC, Policy(lag=1), seed=0)
    for s, arm in enumerate("abcabc", 1):
        b.observe(s, arm, 2.0)
    state = b.state_dict()
    b2 = Bandit.from_state(
        state,
        [
            ConfiguredArm("a", "id-a", False),
            ConfiguredArm("b", "CHANGED", True),
            ConfiguredArm("c", "id-c", True),
            ConfiguredArm("d", "id-d", True),
        ],
    )
    reasons = {z.name: z.reason for z in b2.zombies}
    assert reasons["a"] == "source not available"
    assert reasons["b"].startswith("source identity changed (state id-b, configured CHANGED)")
    assert b2.rewards()["d"] == 0.0 and b2.counters().pulls["d"] == 0  # joined fresh
    assert b2.rewards()["c"] == b.rewards()["c"]  # history kept
    p = b2.probabilities()
    assert p["a"] == p["b"] == 0.0 and p["c"] > 0 and p["d"] > 0
    # A replayed loss of a step trained on an arm that has since become a zombie is history, not an error.
    b2.observe(7, "a", 1.0)
    assert b2.counters().pulls["a"] == 3 and b2.probabilities()["a"] == 0.0
    with pytest.raises(PolicyError, match="no live arm"):
        Bandit.from_state(state, [])


# ---------------------------------------------------------------------------------- file formats


def test_unknown_policy_key_is_named(tmp_path: Path) -> None:
    f = tmp_path / "policy.toml"
    f.write_text("alpha = 0.9\n[arms.code]\nflor = 0.1\n")
    with pytest.raises(PolicyError, match=re.escape("arms.code.flor: unknown key")):
        load_policy(f)
    f.write_text("alpah = 0.9\n")
    with pytest.raises(PolicyError, match="alpah: unknown key"):
        load_policy(f)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[arms.code]\nfloor = 0.6\ncap = 0.5\n", "floor 0.6 is above cap 0.5"),
        ("[arms.a]\nfloor = 0.7\n[arms.b]\nfloor = 0.4\n", "floors sum to 1.1"),
        ("[arms.a]\nfloor = true\n", "arms.a.floor"),
        ("[arms.a]\ncap = 1.5\n", "arms.a.cap"),
        ("lag = 0\n", "lag"),
        ("alpha = 1.0\n", "alpha"),
        ("[initial_weights]\na = 0\n", "initial_weights.a"),
        ("[arms.'bad name']\n", "does not match"),
        ("alpha = \n", "not valid TOML"),
    ],
)
def test_bad_policies(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        parse_policy(text)


def test_load_policy_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.toml")


def test_policy_fingerprint() -> None:
    assert parse_policy("").fingerprint() == parse_policy("alpha = 0.9\nlag = 8\n").fingerprint()
    half, more = parse_policy("[arms.a]\ncap = 0.5\n"), parse_policy("[arms.a]\ncap = 0.6\n")
    assert half.fingerprint() != more.fingerprint()
    assert re.fullmatch(r"[0-9a-f]{64}", Policy().fingerprint())


def _toml_blocks(markdown: str) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", markdown, flags=re.S)


def test_documented_examples_parse() -> None:
    doc = (ROOT / "docs" / "bandit.md").read_text()
    blocks = _toml_blocks(doc)
    assert blocks
    for block in blocks:
        parse_policy(block, "docs/bandit.md")
    module_doc = policy_mod.__doc__ or ""
    example = re.search(r"policy\.toml``::\n\n(.*?)\n\nArms the policy", module_doc, flags=re.S)
    assert example is not None
    policy = parse_policy(textwrap.dedent(example.group(1)), "policy.py docstring")
    assert policy.arms["code"].floor == 0.2 and policy.initial_weight("code") == 2.0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["arms"][0].update(pulls="400"), "arms.0.pulls"),
        (lambda d: d["arms"][0].update(pulls=401), "pulls sum to 620"),
        (lambda d: d.update(policy_fingerprint="0" * 64), "policy_fingerprint"),
        (lambda d: d["arms"][2].update(live=False), "zombie_reason is required"),
        (lambda d: d.update(extra=1), "extra: unknown key"),
        (lambda d: d.update(steps_in_phase=5), "steps_in_phase 5"),
    ],
)
def test_bad_states(mutate, message: str) -> None:
    d = json.loads(seed_state())
    mutate(d)
    with pytest.raises(BanditStateError, match=re.escape(message)):
        parse_state(json.dumps(d), "run/.state.json")


def test_malformed_state_json() -> None:
    with pytest.raises(BanditStateError, match=r"unusable bandit state \(run/.state.json\)"):
        parse_state('{"version": 1, "seed": ', "run/.state.json")
    assert isinstance(parse_state(seed_state()), BanditState)
