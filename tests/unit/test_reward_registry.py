"""Rewards are a registry: a reward defined and registered here, in the test, and nowhere else in
the code, runs a bandit through the public path (a policy naming it, the assignment book, a state
written, checked against the replayed log and restored, the status report), as a new module of
andrea.daemon.mixing.rewards would."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from andrea.daemon.mixing import rewards
from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm, parse_state
from andrea.daemon.mixing.policy import REWARDS, PolicyError, parse_policy
from andrea.daemon.mixing.reward import ArmStats
from andrea.daemon.mixing.startup import check_against_log
from andrea.protocol.lossentry import LossEntry
from tests.support.bandit import synthetic_loss

ARMS = [ConfiguredArm(n, f"id-{n}", True) for n in ("a", "b", "c")]
STEPS = 120


def fewest_pulls(
    stats: Sequence[ArmStats],
    pulls: Sequence[int],
    pending: Sequence[int],
    t: int,
    initial: Sequence[float],
) -> np.ndarray:
    """A toy: nine tenths of the mixture to the arm with the fewest steps known and pending."""
    n = np.array(pulls) + np.array(pending)
    w = np.full(n.size, 0.1 / n.size)
    w[int(np.argmin(n))] += 0.9
    return w


TOY = rewards.RewardKind(
    name="toy-fewest",
    meaning="nine tenths to the arm trained least",
    statistics=(),
    weights=fewest_pulls,
    shares=lambda stats, pulls: [float(p) for p in pulls],
    counts_pending=True,
    reads_progress=False,
    replayed=("first_loss",),
)


@pytest.fixture
def toy() -> Iterator[rewards.RewardKind]:
    rewards.register(TOY)
    yield TOY
    rewards.unregister(TOY.name)


def test_a_reward_registered_in_a_test_runs_through_the_public_path(
    toy: rewards.RewardKind,
) -> None:
    policy = parse_policy(f'reward = "{toy.name}"\nlag = 4\n')
    book = AssignmentBook(Bandit(ARMS, policy, seed=3), ARMS)
    entries, arms = [], {}
    for s in range(1, STEPS + 1):
        arm = book.assign(s)
        assert arm is not None
        arms[s] = arm
        loss = synthetic_loss(s, arm)
        book.record(s, arm, loss, 0)
        entries.append(
            LossEntry(
                step=s,
                loss=loss,
                arm=arm,
                lr=1e-3,
                tokens=64,
                wall_time=1.75e9 + s,
                segment=1,
                phase=0,
                batch_sha256=None,
            )  # fmt: skip
        )
    # The toy's pending-aware rule keeps the arms within a few steps of each other.
    counts = [list(arms.values()).count(a.name) for a in ARMS]
    assert max(counts) - min(counts) <= 6, counts
    report = book.bandit.reward_report()
    assert (report.kind, report.meaning) == (toy.name, toy.meaning)
    assert [report.arms[a.name].reward for a in ARMS] == [
        float(book.bandit.counters().pulls[a.name]) for a in ARMS
    ]
    # Written, checked against the log (the toy's replayed statistic included), read back.
    state = parse_state(book.persistable(STEPS - 4).model_dump_json())
    check_against_log(state, entries, {})
    edited = state.model_copy(
        update={"arms": [state.arms[0].model_copy(update={"first_loss": 9.0}), *state.arms[1:]]}
    )
    with pytest.raises(ValueError, match="first_loss"):
        check_against_log(edited, entries, {})
    again = AssignmentBook(Bandit.from_state(state, ARMS), ARMS)
    for e in entries[: STEPS - 4]:
        again.record(e.step, e.arm, e.loss, 0)
    # The restored bandit draws the steps after the state's exactly as the first one did.
    assert [again.assign(s) for s in range(STEPS - 3, STEPS + 1)] == [
        arms[s] for s in range(STEPS - 3, STEPS + 1)
    ]


def test_every_built_in_reward_has_its_module() -> None:
    assert set(REWARDS) <= set(rewards.names())
    for name in REWARDS:
        kind = rewards.lookup(name)
        assert kind.name == name and kind.meaning


def test_an_unknown_reward_is_refused_by_name() -> None:
    with pytest.raises(PolicyError, match="unknown reward 'nope' .*gated-heldout"):
        parse_policy('reward = "nope"\n')
    with pytest.raises(ValueError, match="registered twice"):
        rewards.register(rewards.lookup("loss"))
    with pytest.raises(ValueError, match="no such arm statistics"):
        rewards.RewardKind("bad", "", ("nothing",), fewest_pulls, TOY.shares)
