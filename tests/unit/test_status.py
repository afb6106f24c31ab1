"""The typed status replies: what crosses the control socket and how andreactl reads it."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from andrea.control.commands.status import status_text
from andrea.control.offline import lock_holder, offline_summary, process_paused
from andrea.control.reports import DaemonLiveness, OfflineSummary, StatusReport
from andrea.daemon.rundir.layout import STATE_FILE, claim, lock_path
from andrea.protocol.status import Activity, ProxyStatus, TrainerStatus

TRAINER = {
    "role": "trainer",
    "pid": 4242,
    "world_size": 1,
    "agent_pid": None,
    "activity": "holding",
    "step": 30,
    "max_steps": 100,
    "loss_ema": 4.5,
    "last_checkpoint": 30,
    "segment": 2,
    "phase": 1,
    "mixing": "proxy",
    "proxy_connected": True,
    "preset": "andrea-tiny",
    "run_dir": "/runs/a",
    "device": "cpu",
    "dtype": "float32",
    "grad_accum": 2,
    "compiled": False,
    "eval_every": 10,
    "last_eval": {
        "step": 30,
        "segment": 2,
        "phase": 1,
        "arms": {
            "code": {"loss": 2.5, "sequences": 64, "tokens": 4096},
            "prose": {"loss": "NaN", "sequences": 8, "tokens": 512},
        },
        "seconds": 0.25,
        "wall_time": 1700000000.0,
    },
}
PROXY = {
    "role": "proxy",
    "durable_step": 29,
    "max_segment": 2,
    "phase": 1,
    "phase_start_step": 21,
    "lag": 2,
    "probabilities": {"code": 0.25, "prose": 0.75},
    "zombies": [
        {
            "name": "gone",
            "identity": "sha256:00",
            "reason": "source missing",
            "pulls": 3,
            "ema_reward": 0.1,
            "weight": 1.0,
        }
    ],
    "policy_fingerprint": "abc",
    "trainer_step": 29,
}


def test_status_round_trips_as_the_json_the_daemons_send() -> None:
    t = TrainerStatus.model_validate(json.loads(json.dumps(TRAINER)))
    assert t.activity is Activity.HOLDING
    # Non-finite held-out losses travel as the strings .eval.json uses (model_dump_json).
    assert json.loads(t.model_dump_json(exclude_unset=True)) == TRAINER
    p = ProxyStatus.model_validate(PROXY)
    assert p.model_dump(mode="json", exclude_unset=True) == PROXY


def test_unknown_activity_and_unknown_field_are_refused() -> None:
    with pytest.raises(ValidationError, match="activity"):
        TrainerStatus.model_validate({**TRAINER, "activity": "holding after step 30"})
    with pytest.raises(ValidationError, match="surprise"):
        ProxyStatus.model_validate({**PROXY, "surprise": 1})


def _report(trainer: dict | None, proxy: dict | None) -> StatusReport:
    return StatusReport(
        time=datetime(2026, 1, 1, tzinfo=UTC),
        run_dir="/runs/a",
        state="running" if trainer else "stopped",
        trainer=TrainerStatus.model_validate(trainer) if trainer else None,
        proxy=ProxyStatus.model_validate(proxy) if proxy else None,
        offline=None,
    )


def test_andreactl_text_names_the_hold_step_and_zombies() -> None:
    text = status_text(_report(TRAINER, PROXY), Path("/runs/a"))
    first, second = text.splitlines()[:2]
    assert first.startswith("trainer: holding after step 30, step 30/100 (30%), loss EMA 4.5000")
    assert "last checkpoint 30" in second and "segment 2, pid 4242, cpu float32" in second
    assert "probabilities: code 0.250, prose 0.750" in text
    assert "ZOMBIE arm 'gone': source missing (never draws)" in text
    assert text.splitlines()[-1] == (
        "held-out: step 30: mean nan, worst prose (code 2.5000, prose nan; 0.25 s)"
    )


def test_a_trainer_still_starting_has_no_device_yet() -> None:
    starting = {**TRAINER, "activity": "starting", "device": None, "dtype": None}
    lines = status_text(_report(starting, None), Path("/runs/a")).splitlines()
    assert lines[0].startswith("trainer: starting, step 30/100")
    assert lines[1].endswith("segment 2, pid 4242")
    assert lines[2] == "proxy:   not running"
    assert len(lines) == 4 and lines[3].startswith("held-out: step 30")


REWARD = {
    "kind": "learnability",
    "meaning": "share of the recent progress",
    "arms": {
        "code": {"reward": 0.75, "loss": 2.8312, "progress": 0.0031, "pulls": 1200},
        "prose": {"reward": 0.25, "loss": None, "progress": 0.0, "pulls": 0},
        "gone": {"reward": 0.0, "loss": 5.5, "progress": 0.0, "pulls": 3},
    },
}


def test_status_shows_each_arms_reward_and_training_loss_and_what_the_reward_means() -> None:
    lines = status_text(_report(TRAINER, {**PROXY, "reward": REWARD}), Path("/runs/a")).splitlines()
    at = lines.index("         reward: learnability: share of the recent progress")
    header, code, prose, gone = (line.split() for line in lines[at + 1 : at + 5])
    assert header == ["arm", "reward", "train", "loss", "progress", "phase", "steps"]
    assert code == ["code", "0.75", "2.8312", "0.0031", "1,200"]
    assert prose == ["prose", "0.25", "-", "0", "0"]
    assert gone == ["gone", "(zombie)", "0", "5.5000", "0", "3"]
    # A proxy older than the reward choice reports none: nothing is said about it.
    assert not any("reward" in line for line in status_text(_report(TRAINER, PROXY), Path("/r")))


def _stopped_run(tmp_path: Path, state: dict | None) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    if state is not None:
        (run / STATE_FILE).write_text(json.dumps(state))
    return run


def _stopped_text(run: Path) -> tuple[OfflineSummary, str]:
    summary = offline_summary(run)
    report = StatusReport(time=datetime(2026, 1, 1, tzinfo=UTC), run_dir=str(run),
                          state="stopped", trainer=None, proxy=None, offline=summary)  # fmt: skip
    assert StatusReport.model_validate_json(report.model_dump_json()) == report
    return summary, status_text(report, run)


def test_a_stopped_run_shows_the_reward_its_proxy_last_wrote(tmp_path: Path) -> None:
    bandit = {"policy_fingerprint": "f" * 64, "phase": 2}
    summary, text = _stopped_text(_stopped_run(tmp_path, {"bandit": bandit, "live_reward": REWARD}))
    assert summary.reward is not None and summary.reward.model_dump(mode="json") == REWARD
    assert "reward: learnability (as the proxy last wrote .state.json): share of the" in text
    assert "code" in text and "2.8312" in text


BANDIT = {"policy_fingerprint": "f" * 64, "phase": 0}


@pytest.mark.parametrize(
    ("state", "damaged"),
    [
        (None, False),  # a fixed mixture: no proxy state
        ({"bandit": BANDIT}, False),  # written before the reward could be chosen
        ({"bandit": BANDIT, "live_reward": {"kind": 1}}, True),
    ],
)
def test_a_stopped_run_without_a_readable_reward_says_nothing_of_it(
    tmp_path: Path, state: dict | None, damaged: bool
) -> None:
    run = _stopped_run(tmp_path, state)
    summary, text = _stopped_text(run)
    assert summary.reward is None
    if damaged:
        (problem,) = summary.problems
        assert problem.startswith(f"{run / STATE_FILE}: live_reward: ")
    else:
        assert summary.problems == []
    assert not [line for line in text.splitlines() if line.startswith("reward")]


def test_a_paused_trainer_of_a_fixed_mixture_is_neither_stopped_nor_missing_a_proxy(
    tmp_path: Path,
) -> None:
    """SIGSTOP: the trainer holds its lock and answers nothing. Status says it is paused (not
    "stopped"), and of a fixed mixture's proxy, which does not exist, it says nothing."""
    summary = offline_summary(tmp_path)
    report = StatusReport(
        time=datetime(2026, 1, 1, tzinfo=UTC),
        run_dir=str(tmp_path),
        state="paused",
        daemons={
            "trainer": DaemonLiveness(state="paused", pid=4242),
            "proxy": DaemonLiveness(state="not running"),
        },
        mixing="fixed",
        trainer=None,
        proxy=None,
        offline=summary,
    )
    lines = status_text(report, tmp_path).splitlines()
    assert lines[0] == (
        "trainer: paused (SIGSTOP, pid 4242): holds its lock, but runs and answers nothing until "
        "`kill -CONT 4242`"
    )
    assert not [line for line in lines if "proxy" in line], lines
    assert lines[1] == f"{tmp_path}: from its files; last checkpoint none", lines
    proxied = report.model_copy(update={"mixing": "proxy"})
    assert "proxy:   not running" in status_text(proxied, tmp_path).splitlines()


def test_the_holder_of_a_lock_is_read_from_the_kernel_not_the_file(tmp_path: Path) -> None:
    lock = claim(tmp_path, "trainer")  # this process holds it
    lock_path(tmp_path, "trainer").write_text("1")  # what a copied run's lock file would say
    try:
        assert lock_holder(tmp_path, "trainer") == os.getpid()
        assert not process_paused(os.getpid())
    finally:
        lock.close()
    assert lock_holder(tmp_path, "trainer") is None
