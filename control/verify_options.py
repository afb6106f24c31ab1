"""The options of the resume verification, declared once for `andreactl verify-resume` and for
`python -m andrea.control.verify_resume`.

Torch-free on purpose: andreactl builds every subcommand's parser on each call, and importing the
verifier (which imports torch) to build this one would make every andreactl command pay seconds.
So the names a user can type live here, and the problems import them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: The problems a verification can run (see andrea.control.verify_resume).
PROBLEM_NAMES = ("mini", "trainer")

# Deliberately broken resumes of the mini problem. They exist only so that tests can prove every
# check can fail.
SCHEDULER_AFTER_OPTIMIZER = "scheduler-after-optimizer"
SKIP_DATA_CURSOR = "skip-data-cursor"
SKIP_OPTIMIZER_STATE = "skip-optimizer-state"
SKIP_NUMPY_RNG = "skip-numpy-rng"
MINI_SABOTAGES = (SCHEDULER_AFTER_OPTIMIZER, SKIP_DATA_CURSOR, SKIP_OPTIMIZER_STATE, SKIP_NUMPY_RNG)

#: How the trainer problem mixes its arms: alone (the fixed mixture), or with andrea-proxy in the loop.
MIXINGS = ("fixed", "proxy")

#: The trainer problem's broken resumes → the restore its full resume skips (the trainer's hidden
#: negative-control flag, --unsafe-skip-restore).
TRAINER_SABOTAGES = {"skip-cursor": "cursor", "skip-rng": "rng"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The verifier's options (``--run-dir`` is andreactl's global option, so each parser that
    needs it declares it itself)."""
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="new directory for the paths and verification.json",
    )
    parser.add_argument(
        "--problem",
        choices=PROBLEM_NAMES,
        default="mini",
        help="mini: a small model in one process; trainer: the real andrea-trainer daemon",
    )
    parser.add_argument(
        "--sabotage",
        help="break the full resume on purpose, so the verification must fail (mini: "
        + ", ".join(MINI_SABOTAGES)
        + "; trainer: "
        + ", ".join(TRAINER_SABOTAGES)
        + ")",
    )
    parser.add_argument(
        "--reuse", type=Path, help="earlier passed verification whose reference paths are reused"
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="the trainer's tokenized-corpus cache (trainer problem)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="trainer problem: prove the resume on this run config (its preset, data, device) "
        "instead of the tiny preset; --run-dir uses that run's run.toml",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), help="trainer problem: the device (default cpu)"
    )
    parser.add_argument(
        "--mixing",
        choices=MIXINGS,
        help="trainer problem: fixed (default) runs the trainer alone with --mixing fixed; proxy "
        "runs every path with --with-proxy, andrea-proxy in the loop, stopped and restarted with it",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        help="trainer problem: processes, through torchrun --standalone (DDP) when more than 1",
    )
