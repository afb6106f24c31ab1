"""What every andreactl command follows: its row in the command table (:class:`Command`), the exit
codes, a user error (one line, exit 2) and its output (the report as JSON with ``--json``, the text
for a person otherwise)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_GONE = 0, 1, 2, 3, 4
#: What every command's exit code means; a command may add its own (status: 3).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done"),
    (
        EXIT_FAILED,
        "the run refused or did not answer (daemon not running, request refused, check failed)",
    ),
    (
        EXIT_USAGE,
        "usage error: a bad option or value, a missing run directory or input file; nothing changed",
    ),
)


class UserError(Exception):
    """A mistake in the invocation or its inputs: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """The run refused or did not answer: printed as one line, exit code `code` (1)."""

    code = EXIT_FAILED


class ProcessGone(CommandFailed):
    """The daemon a command waited on (``stop --wait``, ``checkpoint --wait``) exited without
    answering: killed, or ended before it could: exit code 4."""

    code = EXIT_GONE


@dataclass(frozen=True)
class Command:
    """One subcommand of andreactl: its row in the command table."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]
    #: Whether the command acts on a run and so needs the global --run-dir.
    needs_run_dir: bool = True
    examples: tuple[str, ...] = ()
    extra_exit_codes: tuple[tuple[int, str], ...] = ()


def no_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a command that has none of its own."""


def emit(args: argparse.Namespace, report: BaseModel, text: str) -> None:
    """The report as JSON (--json, -o json) or the text for a person, on stdout."""
    if args.json:
        print(report.model_dump_json(indent=1))
    else:
        print(text)
