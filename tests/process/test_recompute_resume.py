"""Activation recompute (`--recompute blocks`) with real trainer processes: a run without it turns
it on at a restart (no --allow-config-change: it changes no bit), and the run with it, stopped by
SIGTERM and resumed, ends byte for byte as the run never stopped. The never-stopped run is trained
without recompute: recompute changes no bit (tests/unit/test_recompute.py), so it is the
reference of both, and equal losses say so over a whole run, dropout included (andrea-tiny).

One stopped run carries both (a trainer start costs far more than its steps): trained without
recompute, stopped by SIGTERM before its first cadence checkpoint, resumed with recompute on,
stopped by SIGTERM again mid-interval, resumed with recompute on to its end."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 24
RUN = ("--max-steps", str(STEPS), "--checkpoint-every", "10")
#: The held-out evaluation at each checkpoint is not what this is about: 4 sequences an arm.
RUN_TOML = 'batch_size_per = "step"\n\n[eval]\nsequences = 4\n'


def new_run(run_dir: Path) -> Path:
    run_dir.mkdir()
    (run_dir / "run.toml").write_text(RUN_TOML)
    return run_dir


def losses(run_dir: Path) -> dict[int, str]:
    """Each step's loss, exactly (the newest record per step)."""
    return {
        e["step"]: float(e["loss"]).hex() for e in json.loads((run_dir / ".loss.json").read_text())
    }


def stopped_at(run_dir: Path, cache: Path, recompute: str, step: int) -> str:
    """A start with `--recompute recompute`, stopped by SIGTERM once it logged `step`: its log."""
    t = Daemon(trainer_cmd(run_dir, cache, *RUN, "--recompute", recompute))
    t.wait_for(rf"step {step}/{STEPS} ")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert ("activation recompute per block" in t.log) == (recompute == "blocks"), t.log
    assert "stopped at step" in t.log and "NOT be bit-exact" not in t.log, t.log
    return t.log


def test_recompute_may_change_at_a_restart_and_resumes_bit_exact(
    tmp_path: Path, cache_dir: Path
) -> None:
    plain = new_run(tmp_path / "plain")
    assert run_trainer(plain, cache_dir, *RUN).returncode == 0
    run = new_run(tmp_path / "run")
    stopped_at(run, cache_dir, "none", 3)
    log = stopped_at(run, cache_dir, "blocks", 13)
    assert "activation recompute none → blocks: the same arithmetic, bit for bit" in log, log
    assert "resumed from step_0000" in log, log
    res = run_trainer(run, cache_dir, *RUN, "--recompute", "blocks")
    assert res.returncode == 0, res.stderr
    assert "resumed from step_0000" in res.stderr and "NOT be bit-exact" not in res.stderr, (
        res.stderr
    )
    assert "activation recompute per block" in res.stderr, res.stderr
    assert losses(run) == losses(plain)
    assert (run / bin_name(STEPS)).read_bytes() == (plain / bin_name(STEPS)).read_bytes()
