"""A damaged `.loss.json` or `.eval.json` (issue 24, items 5 and 15): /dev/zero, a 64 GiB sparse
file, a FIFO, a directory, or garbage in the middle. The trainer of a fixed mixture, which writes
both itself, refuses them with exit 4 and one clear line, as the proxy does (a restart cannot
cure them: systemd must not loop); and each daemon names the file that is damaged."""

from __future__ import annotations

import os
from pathlib import Path

from andrea.daemon.rundir.evallog import EvalLog
from andrea.daemon.rundir.layout import EVAL_FILE, LOSS_FILE
from andrea.daemon.rundir.losslog import LossLog
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.protocol.evalentry import ArmEval, EvalEntry
from andrea.protocol.lossentry import LossEntry

from ..support.daemons import run_trainer


def _valid(path: Path) -> None:
    if path.name == LOSS_FILE:
        with LossLog.open(path) as log:
            log.append_many(
                LossEntry(
                    step=s,
                    loss=3.0,
                    arm="alpha",
                    lr=1e-3,
                    tokens=64,
                    wall_time=1.0,
                    segment=1,
                    phase=0,
                    batch_sha256=None,
                )
                for s in range(1, 7)
            )
        return
    with EvalLog.open(path) as log:
        for s in (2, 4, 6):
            arms = {"alpha": ArmEval(loss=3.0, sequences=4, tokens=256)}
            log.append(EvalEntry(step=s, segment=1, phase=0, arms=arms, seconds=0.1, wall_time=1.0))


def damage(run_dir: Path, name: str, kind: str) -> Path:
    path = run_dir / name
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "sparse":
        with open(path, "wb") as f:
            f.truncate(64 << 30)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        _valid(path)
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 8] = b"\0garbage"
        path.write_bytes(bytes(data))
    return path


def test_fixed_mode_trainer_exits_4_without_a_traceback(tmp_path: Path, cache_dir: Path) -> None:
    """The whole path, once (the cases above cover every kind of damage to either file)."""
    path = damage(tmp_path, EVAL_FILE, "directory")
    res = run_trainer(tmp_path, cache_dir, "--mixing", "fixed", "--max-steps", "5")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "Traceback" not in res.stderr and "CRITICAL" not in res.stderr, res.stderr
    assert f"{path}: not a regular file" in res.stderr.splitlines()[-1], res.stderr
    assert not list(tmp_path.glob("step_*")), "nothing trained"
