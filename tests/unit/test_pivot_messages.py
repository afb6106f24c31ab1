"""A pivot's wire contract and the proxy's test-only pauses: the release carries the new phase,
a request names no boundary unless it is a dry run's and carries a policy text or a target, a
malformed pause is ignored by name; `pivot --target`'s usage errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import ValidationError

from andrea.control import andreactl
from andrea.control.commands.conventions import EXIT_USAGE
from andrea.daemon.mixing.pivot_orchestrator import PAUSE_ENV, pauses
from andrea.protocol import messages


def test_the_release_carries_the_new_phase_and_validates_it() -> None:
    phase = messages.NewPhase(phase=2, after_step=40, policy="b" * 64)
    release = messages.ResumeRequest(id="r", hold_id="h", new_phase=phase)
    assert messages.decode(messages.encode(release)) == release
    cancel = messages.decode(b'{"type": "resume", "id": "c", "hold_id": "h"}')
    assert isinstance(cancel, messages.ResumeRequest) and cancel.new_phase is None
    for bad in ({"phase": 0, "after_step": 40}, {"phase": 1, "after_step": -1}):
        with pytest.raises(ValidationError):
            messages.NewPhase(**bad, policy="b" * 64)
    with pytest.raises(ValidationError):
        messages.NewPhase(phase=1, after_step=1, policy="not a fingerprint")


def test_a_hold_is_its_own_message_and_a_checkpoint_holds_nothing() -> None:
    hold = messages.decode(b'{"type": "hold", "id": "h1", "timeout_s": 30}')
    assert isinstance(hold, messages.HoldRequest) and hold.timeout_s == 30
    with pytest.raises(ValidationError):  # the old protocol's hold on a checkpoint request
        messages.decode(b'{"type": "checkpoint", "id": "c", "hold": true}')
    pivot = messages.PivotRequest(id="p", policy_toml="")
    assert pivot.boundary_step is None and not pivot.dry_run


def test_the_pauses_are_read_and_a_bad_one_is_ignored_by_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert pauses(None) == {}
    assert pauses("holding=2.5,released") == {"holding": 2.5, "released": 1.0}
    with caplog.at_level(logging.WARNING):
        assert pauses("holdin=1,committed=x,accepted=0.5") == {"accepted": 0.5}
    assert f"{PAUSE_ENV}: holdin=1 ignored" in caplog.text
    assert "committed=x ignored" in caplog.text


def test_a_pivot_carries_a_policy_text_or_a_target_not_both() -> None:
    target = messages.PivotRequest(id="p", target=["code", "docs=0.5"])
    assert messages.decode(messages.encode(target)) == target and target.policy_toml is None
    for bad in ({}, {"policy_toml": "", "target": ["code"]}, {"target": []}):
        with pytest.raises(ValidationError):
            messages.PivotRequest(id="p", **bad)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--target", "code", "--policy", "p.toml"],
            "--policy FILE or --target ARM[=W]..., not both",
        ),
        ([], "pivot needs --policy FILE or --target"),
        (["--target", "code=x"], "'code=x': the weight 'x' is not a number"),
        (["--target", "code", "code=2"], "arm 'code' is named twice"),
        (["--target", "code=0"], "weights are relative"),
    ],
)
def test_pivot_target_usage_errors_exit_2_before_asking_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    # No daemon runs in tmp_path: a request that got that far would fail otherwise (exit 1).
    assert andreactl.main(["pivot", "--run-dir", str(tmp_path), *argv]) == EXIT_USAGE
    assert said in capsys.readouterr().err
