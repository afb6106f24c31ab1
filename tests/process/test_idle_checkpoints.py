"""A proxy-mode trainer that has resumed and waits for its proxy (down, slow, or being restarted)
holds the resumed step: a stop or a checkpoint request then concerns a step already checkpointed.

Two ways that went wrong, each a crash with exit 1 under systemd's Restart=: a stop after an
accepted config change rewrote the checkpoint before the proxy had numbered the trainer's life
(segment 0, refused by the manifest's own validation); and a checkpoint request for a step whose
checkpoint a person had pruned (`andreactl prune --include-newest`, "safe beside a running
trainer") tried to mark the missing manifest.
"""

from __future__ import annotations

import signal
from pathlib import Path

from andrea.daemon.checkpoint.manager import read_manifest, verify_checkpoint
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, andreactl, run_trainer, trainer_cmd

WAITING = r"waiting for the proxy to assign step 7"


def test_an_idle_trainer_stops_and_checkpoints_without_losing_its_step(
    tmp_path: Path, cache_dir: Path
) -> None:
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--with-proxy", "--max-steps", "6", "--checkpoint-every", "3")
    assert res.returncode == ExitCode.OK, res.stderr
    before = read_manifest(run, 6)
    # No proxy: the trainer resumes at step 6 and waits. A stop with a config change accepted.
    idle = ("--mixing", "proxy", "--max-steps", "100")
    t = Daemon(trainer_cmd(run, cache_dir, *idle, "--seed", "5", "--allow-config-change"))
    t.wait_for(WAITING)
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    manifest, _ = verify_checkpoint(run, 6)
    assert manifest.config["seed"] == 5 and "Traceback" not in t.log
    # A life of its own (the proxy never numbered it): the draws of the earlier lives, under the
    # old seed, are not compared with its cursors, so the next start trusts the checkpoint.
    assert manifest.progress.segment == before.progress.segment + 1
    # The seed is recorded: a plain start resumes. The newest checkpoint is pruned by hand, then
    # requested: it is written again, and the request answered.
    t = Daemon(trainer_cmd(run, cache_dir, *idle))
    t.wait_for(WAITING)
    res = andreactl(run, "prune", "--steps", "6", "--include-newest")
    assert res.returncode == 0 and not (run / "step_000006.json").exists(), res.stderr
    res = andreactl(run, "checkpoint", "--wait")
    assert res.returncode == 0, res.stdout + res.stderr + t.log
    t.wait_for(r"the checkpoint of step 6 is gone from the run directory; writing it")
    assert verify_checkpoint(run, 6)[0].trigger == "control"
    # Pruned again, then stopped: the final checkpoint is written, not taken as already there.
    assert andreactl(run, "prune", "--steps", "6", "--include-newest").returncode == 0
    assert andreactl(run, "stop", "--wait").returncode == 0
    assert t.wait() == ExitCode.OK, t.log
    assert verify_checkpoint(run, 6)[0].trigger == "control"
    assert "Traceback" not in t.log
