"""A bandit rebuilt from `.loss.json` after an arm was removed from the run (a deliberate config
change): the log's steps of that arm replay into a zombie's history, as `Bandit.from_state` keeps
a removed arm, instead of the proxy refusing the log ("unknown arm") and the run stopping."""

from __future__ import annotations

from pathlib import Path

from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.startup import replay, restore_bandit
from andrea.protocol.lossentry import LossEntry
from tests.support.records import entry

ARMS = [ConfiguredArm("code", "c" * 16, True), ConfiguredArm("prose", "p" * 16, True)]


def _entries(arms: list[str]) -> list[LossEntry]:
    return [entry(s, loss=3.0 - s / 100, arm=arm) for s, arm in enumerate(arms, start=1)]


def _rebuilt(run_dir: Path, configured: list[ConfiguredArm], entries: list[LossEntry]) -> Bandit:
    """What the proxy's start does without a `.state.json`: a fresh bandit, the log replayed."""
    bandit = restore_bandit(run_dir, configured, 1337, Policy(), entries).bandit
    book = AssignmentBook(bandit, configured)
    replay(book, entries, 0)
    assert book.assign(len(entries) + 1) in {c.name for c in configured}
    return book.bandit


def test_a_removed_arms_logged_steps_replay_into_a_zombie(tmp_path: Path) -> None:
    trained = ["code", "prose", "docs", "code", "docs", "prose"] * 3
    bandit = _rebuilt(tmp_path, ARMS, _entries(trained))
    (zombie,) = bandit.zombies
    assert zombie.name == "docs" and "not configured" in zombie.reason
    assert bandit.live_arms == ["code", "prose"]
    assert bandit.probabilities()["docs"] == 0.0
    pulls = {a.name: a.pulls for a in bandit.state_dict().arms}
    seen = trained[: bandit.last_step]  # the steps the assignment needed folded in
    assert pulls == {arm: seen.count(arm) for arm in ("code", "docs", "prose")}, pulls
    assert pulls["docs"] > 0


def test_the_live_arms_draw_as_without_the_removed_arm_in_the_rebuild(tmp_path: Path) -> None:
    """The zombie changes no live arm's probability: the bandit rebuilt with it agrees with one
    that restored its state (where the removed arm is a zombie too) at every replayed step."""
    trained = ["code", "prose", "docs"] * 6
    entries = _entries(trained)
    with_all = _rebuilt(tmp_path / "a", [*ARMS, ConfiguredArm("docs", "d" * 16, True)], entries)
    state = with_all.state_dict()
    restored = Bandit.from_state(state, ARMS)
    rebuilt = _rebuilt(tmp_path / "b", ARMS, entries)
    assert rebuilt.probabilities() == restored.probabilities()
