"""A run that diverges stops: no checkpoint of non-finite weights is written, so retention never
rotates the last finite one out, and the exit code says a restart would only diverge again.

It used to train on: every loss NaN from the divergence on, the loss EMA frozen at a healthy-looking
value, and every cadence checkpoint after it NaN weights, until `keep_latest` had deleted the last
finite one.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import tomli_w

from andrea.daemon.checkpoint.manager import checkpoint_steps, verify_checkpoint
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import run_trainer


def test_a_diverging_run_stops_and_keeps_its_last_finite_checkpoint(
    tmp_path: Path, cache_dir: Path
) -> None:
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--max-steps", "4", "--checkpoint-every", "2")
    assert res.returncode == ExitCode.OK, res.stderr
    # The same run, resumed with a learning rate that no model survives.
    config = tomllib.loads((run / rundir.CONFIG_FILE).read_text())
    config.setdefault("optim", {}).update(lr=1e30, warmup_steps=0, grad_clip=0.0)
    (run / rundir.CONFIG_FILE).write_text(tomli_w.dumps(config))
    res = run_trainer(
        run, cache_dir, "--max-steps", "40", "--checkpoint-every", "2", "--allow-config-change"
    )
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "the run diverged" in res.stderr and "Traceback" not in res.stderr
    assert "no final checkpoint: the run diverged at step" in res.stderr
    # Not one checkpoint past the divergence: the newest is the first life's, and it is finite.
    assert checkpoint_steps(run) == [4, 2]
    _, payload = verify_checkpoint(run, 4)
    assert np.isfinite(payload.weights).all()
    # The non-finite loss that stopped it is on record, and nothing was trained long after it.
    losses = {e["step"]: e["loss"] for e in json.loads((run / rundir.LOSS_FILE).read_text())}
    diverged = min(s for s, loss in losses.items() if not np.isfinite(float(loss)))
    assert 4 < diverged and max(losses) <= diverged + 2, losses


def test_a_divergence_before_the_first_checkpoint_says_there_is_none(
    tmp_path: Path, cache_dir: Path
) -> None:
    """It used to log "the newest checkpoint, step none, is kept" (and "step none" again at exit)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.CONFIG_FILE).write_text("[optim]\nlr = 1e30\nwarmup_steps = 0\ngrad_clip = 0.0\n")
    res = run_trainer(run, cache_dir, "--max-steps", "40", "--checkpoint-every", "0")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    errors = [line for line in res.stderr.splitlines() if " ERROR " in line]
    assert errors and not any("none" in line for line in errors), res.stderr
    assert "(no checkpoint yet)" in res.stderr and "not restarted (no checkpoint yet)" in res.stderr
    assert checkpoint_steps(run) == []
