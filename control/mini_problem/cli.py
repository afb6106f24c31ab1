"""The mini resume-verification problem: a tiny training run whose stop and resume can be proved exact.

    python -m andrea.control.mini_problem train --steps 10 --output runs/continuous
    python -m andrea.control.mini_problem train --steps 5 --output runs/stop
    python -m andrea.control.mini_problem train --steps 5 --resume runs/stop/checkpoint.pt --output runs/resume

Every run writes ``checkpoint.pt``, ``checkpoint.pt.sha256`` and ``summary.json`` into a directory that
must not exist yet. Exit codes: 0 done; 2 refused (output exists, bad arguments, a checkpoint that is
corrupt or inconsistent); anything else is a crash. ``andrea.control.verify_resume`` runs the paths and
compares them.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from andrea.control.mini_problem.run import train
from andrea.control.mini_problem.schema import SABOTAGES, Refused

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REFUSED = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m andrea.control.mini_problem", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train_parser = commands.add_parser("train", help="train, checkpoint and summarise one path")
    train_parser.add_argument(
        "--steps", type=int, required=True, help="updates to run (in addition to the resumed ones)"
    )
    train_parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="new directory for checkpoint.pt, its .sha256 and summary.json",
    )
    train_parser.add_argument("--resume", type=Path, help="checkpoint.pt to continue from")
    train_parser.add_argument(
        "--omit-rng-restore",
        action="store_true",
        help="negative control: resume without restoring the random generators",
    )
    train_parser.add_argument(
        "--sabotage",
        choices=SABOTAGES,
        help="deliberately break the resume (tests of the verifier only)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.resume is None and (args.omit_rng_restore or args.sabotage):
        parser.error("--omit-rng-restore and --sabotage only apply with --resume")
    try:
        summary = train(
            args.steps, args.output, args.resume, not args.omit_rng_restore, args.sabotage
        )
    except Refused as exc:
        log.error("refused: %s", exc)
        return EXIT_REFUSED
    print(
        f"{args.output}: step {summary.progress.step} "
        f"(epoch {summary.progress.epoch}, cursor {summary.progress.cursor}), "
        f"eval MSE {summary.eval_mse!r}, next lr {summary.next_lr!r}"
    )
    return EXIT_OK
