"""The command-line options every daemon shares: the run directory and the log level."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..rundir.layout import RUN_DIR_ENV


def add_run_dir_argument(parser: argparse.ArgumentParser) -> None:
    """`--run-dir`, the same for both daemons: $ANDREA_RUN_DIR stands in for it, as for andreactl."""
    from_env = os.environ.get(RUN_DIR_ENV)
    parser.add_argument(
        "--run-dir",
        type=run_dir_path,
        required=not from_env,
        default=Path(from_env) if from_env else None,
        metavar="DIR",
        help=f"the run's directory (created if missing; default: ${RUN_DIR_ENV})",
    )


def run_dir_path(text: str) -> Path:
    """`--run-dir`'s value: an empty one (an unset shell variable, `--run-dir "$RUN"`) is refused;
    `Path("")` is the current directory, which would have become the run's."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty run directory; name one")
    return Path(text)


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, the same for both daemons (the trainer passes its own to its proxy)."""
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="least severe level logged (default: INFO)",
    )
