"""The command-line options every daemon shares: the run directory and the log level."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from andrea.daemon.rundir.layout import RUN_DIR_ENV


def add_run_dir_argument(parser: argparse.ArgumentParser) -> None:
    """`--run-dir`, the same for both daemons: $ANDREA_RUN_DIR stands in for it, as for andreactl."""
    from_env = os.environ.get(RUN_DIR_ENV)
    parser.add_argument(
        "--run-dir",
        type=run_dir_path,
        required=not from_env,
        # A string, which argparse checks with run_dir_path as it checks a --run-dir.
        default=from_env or None,
        metavar="DIR",
        help=f"the run's directory (created if missing; default: ${RUN_DIR_ENV})",
    )


def run_dir_path(text: str) -> Path:
    """`--run-dir`'s value: an empty one (an unset shell variable, `--run-dir "$RUN"`) is refused;
    `Path("")` is the current directory, which would have become the run's."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty run directory; name one")
    if (problem := not_utf8(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return Path(text)


def not_utf8(text: str) -> str | None:
    """Why a run directory's path cannot be used, when it is not UTF-8 (bytes the file system
    holds but no text can: the run's records, its socket location and the control endpoints name
    it as UTF-8 text); None for a usable one. Refused at once, before anything is written, rather
    than failing half-way through a start (and a restart loop under systemd)."""
    # Made absolute as the daemons record it: a relative path inside a directory that is not
    # UTF-8 is refused too.
    full = os.path.abspath(text)
    try:
        full.encode("utf-8")
    except UnicodeEncodeError as e:
        shown = os.fsencode(full).decode("ascii", "backslashreplace")
        byte = os.fsencode(full[e.start])[0]
        return (
            f"{shown}: the path is not UTF-8 (byte 0x{byte:02x}); the run's records and control "
            "sockets name it as UTF-8 text: rename the directory (or the parent that holds the "
            "byte) to a UTF-8 name"
        )
    return None


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, the same for both daemons (the trainer passes its own to its proxy)."""
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="least severe level logged (default: INFO)",
    )
