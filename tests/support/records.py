"""Records as the daemons write them, for tests: a loss entry of a given step, and a run's
.loss.json or .eval.json made valid, then damaged in one of the ways a disk or a person damages
it (a link to /dev/zero, a sparse giant, a FIFO, a directory, garbage in the middle)."""

from __future__ import annotations

import os
from pathlib import Path

from andrea.daemon.rundir.evallog import EvalLog
from andrea.daemon.rundir.layout import LOSS_FILE
from andrea.daemon.rundir.losslog import LossLog
from andrea.protocol.evalentry import ArmEval, EvalEntry
from andrea.protocol.lossentry import LossEntry


def write_valid(path: Path) -> None:
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
        write_valid(path)
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 8] = b"\0garbage"
        path.write_bytes(bytes(data))
    return path


SHA = "0123456789abcdef" * 4


def entry(
    step: int, segment: int = 1, loss: float | None = None, arm: str = "code", phase: int = 0
) -> LossEntry:
    return LossEntry(
        step=step,
        loss=2.0 + 1.0 / step if loss is None else loss,
        arm=arm,
        lr=3e-4,
        tokens=4096,
        wall_time=1_750_000_000.0 + step,
        segment=segment,
        phase=phase,
        batch_sha256=SHA if step % 2 else None,
    )
