"""`andreactl`: the operator's client for an ANDREA run.

    andreactl --run-dir DIR [--json] COMMAND [options]

Commands live in one table, :data:`COMMANDS`: each is a :class:`Command` with its name, help line,
options and a function ``(args) -> exit code``. Adding one (status, checkpoint, stop, pivot, history,
watch, ...) is writing those two functions and adding one row; ``main`` needs no change.

With ``--json`` a command prints one JSON document on stdout (its report) and everything meant for a
person on stderr, so that scripts can pipe it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Command:
    """One subcommand of andreactl."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]
    #: Whether the command acts on a run and so needs the global --run-dir.
    needs_run_dir: bool = True


# --- export ---------------------------------------------------------------------------------------------


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=int, help="export this step (default: the newest intact checkpoint)")
    parser.add_argument("--to", type=Path, required=True, dest="dest", help="new or empty directory for the export")


def cmd_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Export a verified checkpoint of the run (see andrea.control.export)."""
    # Imported here so that commands which do not need torch start fast.
    from andrea.control.export import run_export

    return run_export(args.run_dir, args.dest, args.step, args.json)


# --- verify-resume --------------------------------------------------------------------------------------


def _verify_resume_arguments(parser: argparse.ArgumentParser) -> None:
    # The same options as `python -m andrea.control.verify_resume`, declared here rather than imported:
    # building the parser must not import torch, or every andreactl command would pay seconds for it.
    parser.add_argument("--output", type=Path, required=True, help="new directory for the paths and verification.json")
    parser.add_argument("--problem", choices=("mini", "trainer"), default="mini")
    parser.add_argument("--sabotage", help="break the full resume on purpose, so the verification must fail")
    parser.add_argument("--reuse", type=Path, help="earlier passed verification whose reference paths are reused")
    parser.add_argument("--cache-dir", type=Path, help="the trainer's tokenized-corpus cache (trainer problem)")


def cmd_verify_resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the resume-verification protocol (see andrea.control.verify_resume)."""
    from andrea.control.verify_resume import REPORT_NAME, run_problem

    if not args.json:
        return run_problem(parser, args)
    # The verifier prints its progress and table for a person: keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        code = run_problem(parser, args)
    report = args.output / REPORT_NAME
    if report.is_file():
        print(report.read_text(encoding="utf-8"))
    return code


#: Every subcommand, in the order `andreactl --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "export",
        "copy a verified checkpoint with its config, metrics and load procedure",
        _export_arguments,
        cmd_export,
    ),
    Command(
        "verify-resume",
        "prove with fresh processes that stop + resume reproduces the uninterrupted run",
        _verify_resume_arguments,
        cmd_verify_resume,
        needs_run_dir=False,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="andreactl", description="Operate an ANDREA training run.")
    parser.add_argument("--run-dir", type=Path, help="the run directory")
    parser.add_argument("--json", action="store_true", help="print the command's report as JSON on stdout")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(command_entry=command, command_parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `andreactl` script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command = args.command_entry
    if command.needs_run_dir and args.run_dir is None:
        parser.error(f"{command.name} needs --run-dir DIR")
    return command.run(args, args.command_parser)


if __name__ == "__main__":
    sys.exit(main())
