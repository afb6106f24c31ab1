"""The trainer's pivot hold as a state machine: one identified hold at a time, released only by its
own identity, retries answered the same, a timeout as the last resort."""

from __future__ import annotations

import time

from andrea.daemon.trainer.links.boundary_hold import Holds
from andrea.protocol.status import HoldState


def test_a_hold_is_released_only_by_its_own_identity() -> None:
    holds = Holds()
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
    holds.mark_acknowledged()
    assert holds.describe().acknowledged

    error, _ = holds.release("b")
    assert error is not None and "current hold: a" in error
    assert not holds.take_release("a"), "a resume for another hold released this one"
    assert holds.release("a") == (None, "released after step 25")
    assert holds.take_release("a")
    assert holds.describe() is None
    assert holds.release("a") == (None, "released after step 25"), "a retried resume"
    assert holds.request("b", 200, step=30, timeout_s=60) is None


def test_a_pending_hold_is_cancelled_and_a_held_one_expires() -> None:
    holds = Holds()
    holds.request("a", None, step=3, timeout_s=60)
    assert holds.release("a") == (None, "cancelled before the boundary")
    assert holds.due() is None and not holds.begin("a", 25)

    holds.request("b", None, step=30, timeout_s=0.05)
    holds.begin("b", 50)
    assert not holds.expired("b")
    time.sleep(0.1)
    assert holds.expired("b")
    holds.drop("b")
    assert holds.describe() is None

    holds.request("c", None, step=60, timeout_s=60)
    holds.fail("c", "disk full")
    assert holds.describe().state is HoldState.FAILED
    assert holds.request("d", None, step=61, timeout_s=60) is None, "a failed hold is in no way"
