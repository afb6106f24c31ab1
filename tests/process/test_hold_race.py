"""`andreactl pivot --cancel` racing the hold the proxy asked for, with real daemons: whenever the
cancel lands — before the boundary takes the hold, while the boundary is evaluated and
checkpointed (the hold is taken but not yet begun), or once the trainer holds (the proxy paused
there by its test-only ANDREA_PIVOT_PAUSE, before it commits) — the trainer trains on past its
boundary and holds nothing, the proxy pivots nothing, and the pivot's client hears so."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.pivot import POLICY, ctl, ctl_bg, proxy, stop, trainer_status, wait_hold

EVERY = 10
#: Enough held-out sequences that each boundary's evaluation lasts seconds: the window between
#: the boundary taking the hold and the hold beginning, which a cancel must be able to hit.
BIG_EVAL = "[eval]\nsequences = 1000\n"


def _at_moment(run: Path, moment: str, hold: dict) -> None:
    """Wait for `moment` of the pending `hold`'s life."""
    if moment == "at once":
        return
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        s = trainer_status(run)
        h = s["hold"]
        assert h is not None and h["id"] == hold["id"], s
        if h["state"] == "holding":
            if moment == "while holding" or s["step"] == hold["requested_at_step"]:
                # (A boundary at the request's own step is taken at once: then this round is
                # a cancel while holding.)
                return
        elif moment == "in the boundary's evaluation" and (
            s["activity"] == "evaluating" and s["step"] > hold["requested_at_step"]
        ):
            return  # the boundary after the request took the hold; it begins after this
        time.sleep(0.02)
    raise AssertionError(f"the trainer never reached the moment {moment!r}")


def _trains_past(run: Path, step: int, t: Daemon) -> None:
    deadline = time.monotonic() + 60
    while True:
        s = trainer_status(run)
        if s["step"] > step and s["hold"] is None and s["activity"] != "holding":
            return
        assert time.monotonic() < deadline, f"the trainer still holds after step {step}:\n{t.log}"
        time.sleep(0.1)


def test_a_cancel_at_any_moment_never_leaves_the_trainer_holding(
    tmp_path: Path, cache_dir: Path
) -> None:
    config = tmp_path / "big-eval.toml"
    config.write_text(BIG_EVAL)
    policy = tmp_path / "polish.toml"
    policy.write_text(POLICY)
    run = tmp_path / "run"
    # The window of a cancel while holding: the proxy waits before it confirms the hold and
    # commits, and is stopped (SIGSTOP) meanwhile, for as long as the cancel takes to start.
    p = proxy(run, env={"ANDREA_PIVOT_PAUSE": "holding=5"})
    t = Daemon(
        trainer_cmd(run, cache_dir, "--config", str(config), "--mixing", "proxy")
        + ["--max-steps", "100000", "--checkpoint-every", str(EVERY)]
    )
    t.wait_for(r"step 3/", timeout=300)
    for moment in ("at once", "in the boundary's evaluation", "while holding"):
        client = ctl_bg(run, "pivot", "--policy", str(policy))
        try:
            hold = wait_hold(run, "pending", timeout=120)
            _at_moment(run, moment, hold)
            if moment == "while holding":
                p.signal(signal.SIGSTOP)
            try:
                res = ctl(run, "pivot", "--cancel")
            finally:
                p.signal(signal.SIGCONT)
            assert res.returncode == 0, (moment, res.stderr)
            boundary = (hold["requested_at_step"] // EVERY + 1) * EVERY
            _trains_past(run, boundary, t)
            assert client.wait(timeout=120) == 1, moment
            assert "is gone (cancelled or timed out)" in client.stderr.read(), moment
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    assert not (run / "archive").exists(), "a cancelled pivot pivots nothing"
    assert stop(t) == ExitCode.OK, t.log
    assert stop(p) == ExitCode.OK, p.log
