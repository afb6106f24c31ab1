"""An arm learnt to a noisy floor (letters drawn with fixed odds, in the synthetic landscape of
tests/support/bandit.py) must lose its share soon after its plateau: issue #35's target, which
gated-fall, the default of new runs before gated-plateau, meets on this learner (116 to 130 steps
on six seeds; gated-heldout took 511 to 602). gated-plateau's own bound is in
tests/unit/test_gated_plateau.py. The real runs: docs/mixing-quality.md, "gated-fall"."""

from __future__ import annotations

from andrea.daemon.mixing.policy import Policy
from tests.support.bandit import TEXT3, Learner, run

#: Its 30th loss is within 2% of its floor (1.21 + 4.34 e^-5.8 = 1.223, with noise of 0.02).
PLATEAU_PULL = 30


def first_step_below(trained: list[str], arm: str, share: float, start: int) -> int | None:
    """The first step s >= start at which `arm` had less than `share` of steps s-99..s."""
    for s in range(max(start, 100), len(trained) + 1):
        if trained[s - 100 : s].count(arm) / 100 < share:
            return s
    return None


def steps_to_detect(reward: str, seed: int, steps: int = 800) -> int:
    """Steps from the letters arm's plateau until its share of the last 100 steps is below half
    of 1/K (the rest of the run when that never happens)."""
    trained = run({**TEXT3, "letters": "floor"}, Policy(reward=reward), steps, seed, 100)
    plateau = [s for s, a in enumerate(trained, 1) if a == "letters"][PLATEAU_PULL - 1]
    below = first_step_below(trained, "letters", 0.5 / 4, plateau)
    return steps - plateau if below is None else below - plateau


def test_the_letters_arm_is_flat_from_its_plateau() -> None:
    learner = Learner({"letters": "floor"}, seed=0)
    losses = [learner.loss("letters") for _ in range(200)]
    assert all(abs(x - 1.21) <= 0.02 * 1.21 + 4 * 0.02 for x in losses[PLATEAU_PULL - 1 :])
    assert losses[PLATEAU_PULL - 11] > 1.21 * 1.02 + 4 * 0.02  # still learning 10 losses before


def test_an_arm_learnt_to_a_noisy_floor_loses_its_share_within_150_steps() -> None:
    assert max(steps_to_detect("gated-fall", seed) for seed in range(4)) <= 150
    # The negative control: the default before it remembered the arm's early drops.
    assert min(steps_to_detect("gated-heldout", seed) for seed in range(4)) > 150
