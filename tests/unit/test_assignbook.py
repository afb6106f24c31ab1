"""The assignment book across a proxy restart, in process: a book rebuilt from the persisted
bandit state and the logged losses gives every step the arm the first book gave it, whichever step
the trainer asks for first (the proxy processes themselves: tests/process/test_proxy.py)."""

from __future__ import annotations

import random

import pytest

from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm
from andrea.daemon.mixing.policy import REWARDS, Policy
from tests.support.bandit import synthetic_loss, synthetic_probe, targeted

ARMS = [ConfiguredArm(n, f"id-{n}", True) for n in ("a", "b", "c", "d")]
STEPS = 160
#: The trainer evaluates every this many steps: the next step's record carries the result.
EVAL_EVERY = 20


def heldout(step: int) -> dict[str, float] | None:
    """The held-out losses the record of `step` carries (those of the weights after step - 1)."""
    if step == 1 or (step - 1) % EVAL_EVERY:
        return None
    return {a.name: synthetic_loss(step - 1, a.name) + 0.05 for a in ARMS}


def first_life(reward: str) -> tuple[dict[int, str], AssignmentBook]:
    """A proxy that assigns every step and records each step's loss as the trainer reports it."""
    policy = Policy(reward=reward, **targeted(reward, "a", "b"))
    book = AssignmentBook(Bandit(ARMS, policy, seed=11), ARMS)
    arms: dict[int, str] = {}
    for s in range(1, STEPS + 1):
        arm = book.assign(s)
        assert arm is not None
        arms[s] = arm
        book.record(s, arm, synthetic_loss(s, arm), 0, heldout(s), probe(s, arms))
    return arms, book


def probe(step: int, arms: dict[int, str]) -> dict[str, float] | None:
    """The target's probe the record of `step` carries under the transfer reward (every 4th
    step; any reward but transfer ignores it)."""
    return synthetic_probe(step, ["a", "b"], arms) if step % 4 == 0 else None


def restarted(
    state_book: AssignmentBook,
    arms: dict[int, str],
    durable: int,
    wrong: range = range(0),
) -> AssignmentBook:
    """A proxy restarted from the state it persisted at `durable` and the losses logged up to
    it (arm a's losses of the steps in `wrong` logged 1 nat too low, for the negative control)."""
    state = state_book.persistable(durable)
    book = AssignmentBook(Bandit.from_state(state, ARMS), ARMS)
    for s in range(1, durable + 1):
        loss = synthetic_loss(s, arms[s]) - (1.0 if s in wrong and arms[s] == "a" else 0.0)
        book.record(s, arms[s], loss, 0, heldout(s), probe(s, arms))
    return book


@pytest.mark.parametrize("reward", REWARDS)
@pytest.mark.parametrize("durable", [3, 20, 97])
def test_a_restarted_book_assigns_the_same_arms(reward: str, durable: int) -> None:
    arms, book = first_life(reward)
    again = restarted(book, arms, durable)
    # The trainer may ask for a step past several unlogged ones (it resumed from a later
    # checkpoint than the log reaches): their arms are this step's inputs and are recomputed.
    order = list(range(durable + 1, STEPS + 1))
    random.Random(durable).shuffle(order)
    got = {s: again.assign(s) for s in order if s - again.lag <= durable}
    assert got == {s: arms[s] for s in got}
    assert len(got) >= min(again.lag, STEPS - durable)
    # A step whose inputs have not arrived waits, however far ahead it is.
    assert again.assign(10**6) is None and again.waiting_for(10**6) == durable + 1


@pytest.mark.parametrize("reward", ["gated-learnability", "gated-learnability-2"])
def test_a_wrong_logged_loss_is_seen(reward: str) -> None:
    """The negative control: one logged loss changed moves later arms, so the comparison above
    can fail."""
    arms, book = first_life(reward)
    # The state persisted at step 100 is the snapshot of step 64: the losses after it are replayed.
    again = restarted(book, arms, 100, wrong=range(65, 101))
    got = [again.assign(s) for s in range(101, 109)]
    assert got != [arms[s] for s in range(101, 109)]


def test_a_wrong_logged_evaluation_is_seen() -> None:
    """Under gated-heldout the evaluations the records carry are inputs too: arm d (its loss flat,
    so the gate gives it only exploration) logged as rising in one evaluation gets the least share
    of an arm being forgotten in every step drawn after it, W steps later."""

    def replayed(d_at_101: float) -> AssignmentBook:
        book = AssignmentBook(Bandit(ARMS, Policy(reward="gated-heldout"), seed=11), ARMS)
        for s in range(1, 131):
            arm = book.assign(s)
            assert arm is not None
            evaluated = None
            if s in (61, 81, 101):
                evaluated = {a.name: synthetic_loss(s - 1, a.name) for a in ARMS}
                evaluated["d"] = d_at_101 if s == 101 else 0.5
            loss = 1.0 if arm == "d" else synthetic_loss(s, arm)
            book.record(s, arm, loss, 0, evaluated)
        return book

    true, wrong = replayed(0.49), replayed(0.9)
    assert [true.arm_of[s] for s in range(1, 110)] == [wrong.arm_of[s] for s in range(1, 110)]
    assert true.bandit.probabilities()["d"] < 0.125 / 4
    assert wrong.bandit.probabilities()["d"] == pytest.approx(0.125 / 4)
