"""Activation recompute (`--recompute blocks`) with real trainer processes: a run with it, stopped
by SIGTERM and resumed, ends byte for byte as the run never stopped; a run without it turns it on
at a restart (no --allow-config-change: it changes no bit) and ends the same. The never-stopped run
is trained without recompute: recompute changes no bit (tests/unit/test_recompute.py), so it is
the reference of both, and equal losses say so over a whole run, dropout included (andrea-tiny)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 24
RUN = ("--max-steps", str(STEPS), "--checkpoint-every", "10")


def losses(run_dir: Path) -> dict[int, str]:
    """Each step's loss, exactly (the newest record per step)."""
    return {
        e["step"]: float(e["loss"]).hex() for e in json.loads((run_dir / ".loss.json").read_text())
    }


def stopped_and_resumed(run_dir: Path, cache: Path, first: str, then: str) -> str:
    """A run trained with `--recompute first`, stopped by SIGTERM mid-interval, resumed with
    `--recompute then`: the resumed start's log."""
    t = Daemon(trainer_cmd(run_dir, cache, *RUN, "--recompute", first))
    t.wait_for(rf"step 13/{STEPS} ")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert ("activation recompute per block" in t.log) == (first == "blocks"), t.log
    res = run_trainer(run_dir, cache, *RUN, "--recompute", then)
    assert res.returncode == 0, res.stderr
    assert "resumed from step_0000" in res.stderr and "NOT be bit-exact" not in res.stderr, (
        res.stderr
    )
    return res.stderr


def test_recompute_resumes_bit_exact_and_may_change_at_a_restart(
    tmp_path: Path, cache_dir: Path
) -> None:
    plain = tmp_path / "plain"
    assert run_trainer(plain, cache_dir, *RUN).returncode == 0
    on = tmp_path / "on"
    stopped_and_resumed(on, cache_dir, "blocks", "blocks")
    turned_on = tmp_path / "turned-on"
    log = stopped_and_resumed(turned_on, cache_dir, "none", "blocks")
    assert "activation recompute per block" in log, log
    assert "activation recompute none → blocks: the same arithmetic, bit for bit" in log, log
    final = (plain / bin_name(STEPS)).read_bytes()
    for run in (on, turned_on):
        assert losses(run) == losses(plain)
        assert (run / bin_name(STEPS)).read_bytes() == final
