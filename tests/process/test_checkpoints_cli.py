"""`andreactl checkpoints` and `andreactl prune` over a real run's checkpoints, and the LR schedule's
length set on the command line and logged at start.

One `andreactl` runs in a fresh interpreter, as an operator's shell runs it; the listings and prunes
after it, over files alone (the trainer has exited), call the same entry point in this process."""

from __future__ import annotations

import json
import signal
import tomllib
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.rundir.losslog import read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd
from tests.support.daemons import andreactl as ctl


def local_ctl(capsys: pytest.CaptureFixture[str], run: Path, *args: str) -> tuple[int, str]:
    """`andreactl --run-dir RUN ARGS` in this process: its exit code and what it printed."""
    capsys.readouterr()
    code = andreactl.main(["--run-dir", str(run), *args])
    return code, capsys.readouterr().out


#: Seconds to wait for a daemon's log line: generous, for a loaded 2-core machine.
WAIT = 300


def test_list_and_prune_checkpoints_and_the_schedule_length(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    t = Daemon(
        trainer_cmd(
            run,
            cache_dir,
            "--max-steps",
            "100000",
            "--checkpoint-every",
            "10",
            "--decay-steps",
            "20",
        )
    )
    t.wait_for(
        r"LR schedule: linear warmup to 0\.003 over 20 steps, cosine decay to 0\.0003 at step 20",
        timeout=WAIT,
    )
    t.wait_for(
        r"WARNING max_steps 100,000 runs past the end of the LR decay at step 20", timeout=WAIT
    )
    for n in (3, 14):
        t.wait_for(rf"step {n}/", timeout=WAIT)
        t.signal(signal.SIGUSR1)
        t.wait_for(r"checkpoint step_\d+\.bin written \(sigusr1", timeout=WAIT)
    t.wait_for(r"step 41/", timeout=WAIT)
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert tomllib.loads((run / "run.toml").read_text())["optim"]["decay_steps"] == 20
    assert {e.lr for e in read_entries(run / ".loss.json") if e.step > 20} == {3e-4}

    res = ctl(run, "--json", "checkpoints")
    assert res.returncode == 0, res.stderr
    listed = json.loads(res.stdout)["checkpoints"]
    steps = [c["step"] for c in listed]
    assert steps == sorted(steps, reverse=True)
    audit = [c["step"] for c in listed if c["trigger"] == "sigusr1"]
    assert len(audit) == 2 and all(c["state"] == "ok" for c in listed)
    assert all(c["bytes"] == (run / bin_name(c["step"])).stat().st_size for c in listed)

    # A damaged one is listed as such, and left alone by a prune.
    damaged = audit[0]
    with open(run / bin_name(damaged), "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    # The other audit point is a pivot boundary (as archive/ records it).
    boundary = audit[1]
    (run / "archive" / "pivot-x").mkdir(parents=True)
    (run / "archive" / "pivot-x" / "pivot.json").write_text(
        json.dumps({"boundary_step": boundary, "old_phase": 0, "new_phase": 1, "utc": "x"})
    )
    code, out = local_ctl(capsys, run, "checkpoints")
    assert code == 0 and "damaged" in out and "(pivot boundary)" in out, out

    newest = steps[0]
    _, out = local_ctl(capsys, run, "--json", "prune", "--keep-latest", "0", "--dry-run")
    plan = json.loads(out)
    assert plan["dry_run"] and newest not in plan["removed"] and boundary not in plan["removed"]
    assert damaged not in plan["removed"] and plan["removed"]
    assert all((run / bin_name(s)).exists() for s in steps)

    code, out = local_ctl(capsys, run, "--json", "prune", "--keep-latest", "0")
    assert code == 0, out
    left = sorted(int(p.stem.split("_")[1]) for p in run.glob("step_*.json"))
    assert left == sorted({newest, boundary, damaged})
    _, out = local_ctl(
        capsys, run, "--json", "prune", "--keep-latest", "0", "--steps", str(boundary)
    )
    assert json.loads(out)["removed"] == []
    code, out = local_ctl(capsys, run, "prune", "--steps", str(boundary), "--include-boundaries")
    assert code == 0 and not (run / bin_name(boundary)).exists(), out

    # The run resumes from what is left.
    res = run_trainer(run, cache_dir, "--max-steps", str(newest + 2))
    assert res.returncode == ExitCode.OK and f"resumed from {bin_name(newest)}" in res.stderr
