"""The trainer's pivot hold as a state machine: one identified hold at a time, released only by its
own identity, retries answered the same, a timeout as the last resort, and the request's answer
told exactly once: when the trainer holds with every record acknowledged, or cannot."""

from __future__ import annotations

import time

from andrea.daemon.trainer.links.hold_registry import HoldRegistry, gone
from andrea.protocol.messages import NewPhase
from andrea.protocol.status import HoldState

PHASE = NewPhase(phase=1, after_step=25, policy="a" * 64)


def _told(holds: HoldRegistry) -> list[tuple[str, int | None, str | None]]:
    told: list[tuple[str, int | None, str | None]] = []
    holds.on_settled(lambda hold_id, step, error: told.append((hold_id, step, error)))
    return told


def test_a_hold_is_released_only_by_its_own_identity() -> None:
    holds = HoldRegistry()
    told = _told(holds)
    assert holds.request("a", 100, step=7, timeout_s=60) is None
    assert holds.request("a", 100, step=7, timeout_s=60) is None  # a retried request
    error = holds.request("b", 200, step=8, timeout_s=60)
    assert error is not None and "hold a" in error and "pid 100" in error
    hold = holds.due()
    assert hold is not None and hold.id == "a" and hold.requested_step == 7

    assert holds.begin("a", 25)
    status = holds.describe()
    assert status is not None
    assert (status.state, status.step, status.requested_at_step) == (HoldState.HOLDING, 25, 7)
    assert status.age_s >= 0 and not status.acknowledged
    assert told == [], "answered before every record was acknowledged"
    holds.mark_acknowledged()
    holds.mark_acknowledged()
    assert holds.describe().acknowledged
    assert told == [("a", 25, None)], "the answer is told once, with the boundary"

    error, _ = holds.release("b")
    assert error is not None and "current hold: a" in error
    assert holds.take_release("a") is None, "a resume for another hold released this one"
    assert holds.describe() is not None
    assert holds.release("a", PHASE) == (None, "released after step 25")
    # Released, not yet taken by the loop: the proxy's confirmation hears it is gone.
    assert holds.request("a", 100, step=7, timeout_s=60) == gone("a", "released after step 25")
    assert holds.take_release("a") == PHASE, "the release carries the proxy's new phase"
    assert holds.describe() is None
    assert holds.release("a") == (None, "released after step 25"), "a retried resume"
    assert holds.request("a", 100, step=30, timeout_s=60) == gone("a", "released after step 25")
    assert holds.request("b", 200, step=30, timeout_s=60) is None
    assert len(told) == 1


def test_a_pending_hold_is_cancelled_and_a_held_one_expires() -> None:
    holds = HoldRegistry()
    told = _told(holds)
    holds.request("a", None, step=3, timeout_s=60)
    assert holds.release("a") == (None, "cancelled before the boundary")
    assert holds.due() is None and not holds.begin("a", 25)
    assert told == [("a", None, gone("a", "cancelled before the boundary"))]

    holds.request("b", None, step=30, timeout_s=0.05)
    holds.begin("b", 50)
    assert not holds.expired("b")
    time.sleep(0.1)
    assert holds.expired("b")
    holds.drop("b", "hold b timed out")
    assert holds.describe() is None
    assert told[-1] == ("b", None, "hold b timed out")

    holds.request("c", None, step=60, timeout_s=60)
    holds.fail("c", "disk full")
    assert holds.describe().state is HoldState.FAILED
    assert told[-1] == ("c", None, "disk full")
    assert holds.request("d", None, step=61, timeout_s=60) is None, "a failed hold is in no way"
    holds.abandon("the trainer stopped")
    assert told[-1] == ("d", None, "the trainer stopped"), "a stop answers a pending hold"
