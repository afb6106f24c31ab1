"""A torchrun job of test trainers, shared by the distributed and elastic tests."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.daemons import Daemon, trainer_args


def torchrun(run_dir: Path, cache: Path, *extra: str, nproc: int = 2, launch=()) -> list[str]:
    """The command the docs give: torchrun --standalone ... --no-python andrea-trainer ARGS."""
    head = list(launch) or ["--standalone"]
    return [
        str(BIN / "torchrun"),
        *head,
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        "0",
        "--no-python",
        str(BIN / "andrea-trainer"),
        *job_args(run_dir, cache, *extra),
    ]


def job(cmd: list[str]) -> Daemon:
    # Its own session: a stray signal to the test's process group never reaches the job.
    return Daemon(cmd, start_new_session=True)


BIN = Path(sys.executable).parent


def job_args(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    return trainer_args(
        run_dir, cache, "--max-steps", str(STEPS), "--checkpoint-every", str(EVERY), *extra
    )


STEPS = 16


EVERY = 8
