"""The typed status replies: what crosses the control socket and how andreactl reads it."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from andrea.control.commands.status import status_text
from andrea.control.reports import StatusReport
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
