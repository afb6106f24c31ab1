"""A pivot's wire contract and the proxy's test-only pauses: the release carries the new phase,
a request names no boundary unless it is a dry run's, a malformed pause is ignored by name."""

from __future__ import annotations

import logging

import pytest
from pydantic import ValidationError

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
