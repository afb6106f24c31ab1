"""gated-plateau: a plateau called from a line through the arm's own losses, a call that holds while
the arm is left out, a retest that ends it when the fall resumed, and all of it in the state so that
a restart continues the same mixture (rewards/gated_plateau.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from andrea.daemon.mixing import reward
from andrea.daemon.mixing.bandit import ArmState, Bandit, ConfiguredArm, parse_state
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.reward import RECENT_KEPT, ArmStats
from andrea.daemon.mixing.rewards import gated_fall
from andrea.daemon.mixing.rewards import gated_plateau as gp
from tests.support.bandit import TEXT3, Learner, run, second_half_share
from tests.unit.test_plateau_reward import PLATEAU_PULL, steps_to_detect


def feed(s: ArmStats, step: int, loss: float) -> None:
    """What the bandit does with an arm's loss under gated-plateau."""
    reward.observe(s, step, loss, 0.9)
    gp.observe(s, step, loss)


def called_at_its_floor() -> ArmStats:
    """An arm that fell from 5 to a floor of 3 (noise 0.005) over its first 160 steps: called."""
    s = ArmStats()
    for step in range(1, 161):
        feed(s, step, 3.0 + 2.0 * math.exp(-step / 8) + 0.005 * math.sin(step * 1.7))
    assert s.cut_level is not None and abs(s.cut_level - 3.0) < 0.01
    return s


def test_the_line_is_the_least_squares_line() -> None:
    rng = np.random.default_rng(3)
    steps = sorted(int(x) for x in rng.choice(np.arange(1, 5000), 40, replace=False))
    losses = [3.0 - 2e-4 * x + float(rng.normal(0, 0.1)) for x in steps]
    level, slope, se = gp.line(losses, steps, 30)
    x, y = np.array(steps[-30:], dtype=float), np.array(losses[-30:])
    design = np.stack([x, np.ones_like(x)], axis=1)
    (b, a), rss, *_ = np.linalg.lstsq(design, y, rcond=None)
    cov = rss[0] / (30 - 2) * np.linalg.inv(design.T @ design)
    assert slope == pytest.approx(b, rel=1e-9)
    assert level == pytest.approx(a + b * x[-1], rel=1e-9)
    assert se == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_an_arm_at_its_floor_is_called_and_a_noisy_text_arm_is_not(seed: int) -> None:
    letters, text = ArmStats(), ArmStats()
    floor, learner = Learner({"letters": "floor"}, seed), Learner({"t": "text"}, seed)
    called = None
    for step in range(1, 800):
        feed(letters, step, floor.loss("letters"))
        called = called or (step if letters.cut_level is not None else None)
        feed(text, step, learner.loss("t"))
        # The newest quarter of its losses, at most its last 400, and at least 8 (none before).
        expected = max(gp.MIN_LOSSES, round(min(step, 400) / 4)) if step >= gp.MIN_LOSSES else 0
        assert gp.window(text) == expected
    # 98% of the letters' fall is behind them at their 20th loss (1.21 + 4.34 e^-n/5).
    assert called is not None and 20 < called <= 50
    text_calls = sum(1 for _ in _calls(seed))
    assert text_calls <= 0.03 * 800
    # The negative control: gated-fall's estimate from the loss EMA's new lows, on the same arm.
    assert sum(1 for _ in _calls(seed, gated_fall.plateaued)) > 0.5 * 800


def _calls(seed: int, rule: gated_fall.Plateau | None = None) -> list[int]:
    """The steps at which a text arm trained alone is called plateaued, by gated-plateau or by
    `rule`."""
    s, learner, out = ArmStats(), Learner({"t": "text"}, seed), []
    for step in range(1, 800):
        feed(s, step, learner.loss("t"))
        if (s.cut_level is not None) if rule is None else rule(s, step):
            out.append(step)
    return out


def test_the_call_holds_while_the_arm_is_left_out_and_forgotten() -> None:
    s = called_at_its_floor()
    cut, at = s.cut_level, s.cut_step
    # Left out: a loss now and then, each higher than the last (the model forgets it).
    for i, step in enumerate(range(at + 20, at + gp.RETEST, 20)):
        feed(s, step, 3.0 + 0.2 * i)
        assert (s.cut_level, s.cut_step) == (cut, at)
        assert gp.plateaued(s, step)


@pytest.mark.parametrize(("burst_loss", "ends"), [(3.0, False), (2.9, True)])
def test_a_retest_comes_due_and_ends_the_call_only_on_a_new_low(
    burst_loss: float, ends: bool
) -> None:
    s = called_at_its_floor()
    assert s.cut_level is not None
    at, due = s.cut_step, s.cut_step + gp.RETEST
    assert gp.plateaued(s, due) and not gp.plateaued(s, due + 1)
    for i in range(gp.BURST):
        assert not gp.plateaued(s, due + 1 + i)  # its share back until the burst is known
        # The first half of the burst is relearning; only the second half is judged.
        feed(s, due + 1 + i, 4.0 if i < gp.BURST // 2 else burst_loss)
    if ends:
        assert s.cut_level is None and not gp.plateaued(s, due + gp.BURST)
    else:
        assert s.cut_step == due + gp.BURST > at
        assert gp.plateaued(s, due + gp.BURST + gp.RETEST)
        assert not gp.plateaued(s, due + gp.BURST + gp.RETEST + 1)


def test_a_new_low_between_retests_ends_the_call() -> None:
    s = called_at_its_floor()
    assert s.cut_level is not None and s.first_loss is not None
    step = s.cut_step
    low = s.cut_level - gp.MARGIN * (s.first_loss - s.cut_level)
    while s.cut_level is not None:
        step += 1
        feed(s, step, low - 0.05)
    assert step < s.recent_steps[0] + RECENT_KEPT  # within the line's window of new lows


def test_the_retests_clock_is_the_newest_step_of_an_arm_with_a_line() -> None:
    fresh, s = ArmStats(), called_at_its_floor()
    feed(fresh, 500, 4.0)  # one loss: no line yet
    assert gp.newest_step([s, fresh]) == 160


def test_a_synthetic_floor_arm_is_left_out_and_retested() -> None:
    """In a run, the letters get a retest's burst every RETEST steps and little else."""
    for seed in range(3):
        trained = run({**TEXT3, "letters": "floor"}, Policy(reward="gated-plateau"), 1500, seed)
        assert second_half_share(trained, "letters") < 0.1
        for arm in TEXT3:
            assert second_half_share(trained, arm) > 0.25


def _run_with_restart(
    policy: Policy, steps: int, restart_at: int | None, seed: int = 4
) -> tuple[list[str], ArmStats | None, int | None]:
    """tests.support.bandit.run, with the bandit saved and rebuilt from its state once all the
    losses up to `restart_at` are incorporated (never: None); the letters' statistics then, and
    the step of the loss at which they were first called plateaued."""
    kinds = {**TEXT3, "letters": "floor"}
    arms = [ConfiguredArm(n, n, True) for n in kinds]
    b, learner = Bandit(arms, policy, seed=seed), Learner(kinds, seed)
    losses: dict[int, tuple[str, float]] = {}
    trained: list[str] = []
    letters, called = None, None
    for s in range(1, steps + 1):
        while b.last_step < s - policy.lag:
            j = b.last_step + 1
            b.observe(j, *losses[j])
            state = b.state_dict()
            if called is None and losses[j][0] == "letters":
                called = j if next(a for a in state.arms if a.name == "letters").cut_level else None
            if j == restart_at:
                saved = state.model_dump_json()
                b = Bandit.from_state(parse_state(saved), arms)
                assert b.state_dict().model_dump_json() == saved
                letters = next(a for a in state.arms if a.name == "letters").stats()
        arm = b.assign(s, [losses[j][0] for j in range(b.last_step + 1, s)])
        losses[s] = (arm, learner.loss(arm))
        trained.append(arm)
    return trained, letters, called


@pytest.mark.parametrize("seed", range(4))
def test_the_letters_are_called_within_150_steps_of_their_plateau(seed: int) -> None:
    """The call comes 47-140 steps after the plateau of tests/unit/test_plateau_reward.py (within
    2% of the floor, the letters' 30th loss) on these seeds; their share of the last 100 steps is
    below half of 1/K 107-200 steps after it, the retests' bursts of 16 losses included."""
    trained, _, called = _run_with_restart(Policy(reward="gated-plateau"), 800, None, seed)
    plateau = [s for s, arm in enumerate(trained, 1) if arm == "letters"][PLATEAU_PULL - 1]
    assert called is not None and 0 < called - plateau <= 150
    assert steps_to_detect("gated-plateau", seed) <= 200


def test_a_restart_during_a_call_or_a_retest_continues_bit_for_bit() -> None:
    policy = Policy(reward="gated-plateau")
    reference, _, _ = _run_with_restart(policy, 900, None)
    letters = [s for s, arm in enumerate(reference, 1) if arm == "letters"]
    burst = next(s for a, s in zip(letters, letters[1:]) if s - a > 100)  # the first retest's
    before, held, retest = 30, burst - 100, burst + 3
    for at in (before, held, retest):
        trained, stats, _ = _run_with_restart(policy, 900, at)
        assert trained == reference
        assert stats is not None and (stats.cut_level is None) == (at == before)
        assert (len(gp.retest_losses(stats)) > 0) == (at == retest)


def test_a_state_without_the_plateau_statistics_loads_and_a_broken_one_is_refused() -> None:
    arm = ArmState(
        name="code", identity="x", live=True, pulls=3, ema_reward=1.0, weight=1.0, probability=1.0
    )
    assert arm.stats().recent_losses == [] and arm.stats().cut_level is None
    fields = arm.model_dump()
    broken = (
        {"recent_losses": [3.0], "recent_steps": []},
        {"recent_losses": [3.0, 2.9], "recent_steps": [5, 5], "first_step": 1},
        {"recent_losses": [3.0], "recent_steps": [4], "first_step": 5},
        {"cut_level": 3.0},
        {"cut_step": 7},
        {"recent_losses": [3.0] * (RECENT_KEPT + 1), "recent_steps": list(range(1, 102))},
    )
    for change in broken:
        with pytest.raises(ValidationError):
            ArmState(**{**fields, **change})
