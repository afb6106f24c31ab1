"""`andreactl`: the operator's client for an ANDREA run, with the conventions of systemctl and kubectl.

    andreactl COMMAND [--run-dir DIR] [--json | -o json] [options]

Global options go before or after the command; ``ANDREA_RUN_DIR`` stands in for ``--run-dir``. With
``--json`` (or ``-o json``) a command prints one JSON document on stdout, whose schema is its model in
:mod:`andrea.control.reports` (``andreactl schema COMMAND``), and everything meant for a person on stderr.

This module is the shell: the global options, the parser built from :data:`COMMANDS`, dispatch, and
the mapping of errors to exit codes. The commands live in :mod:`andrea.control.commands`, one module
per family, each declaring its :class:`Command` rows (name, help line, options, examples and a
function ``(args, parser) -> exit code``). Adding one is writing those and adding its row to
:data:`COMMANDS`; ``main`` needs no change. A user error (a missing run directory, an unreadable file,
a bad value) is one ``andreactl: ...`` line and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, NoReturn

from andrea.control.commands import (
    checkpoints,
    generate,
    history,
    observability,
    pivot,
    plan,
    status,
    tokenizer,
    tools,
    trainer_requests,
)
from andrea.control.commands.conventions import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_USAGE,
    Command,
    CommandFailed,
    UserError,
)
from andrea.control.commands.failures import UsageError, failed, usage_error
from andrea.daemon.rundir.boundedio import FileRejected
from andrea.daemon.rundir.layout import RUN_DIR_ENV, SocketDirError
from andrea.daemon.rundir.losslog import LossLogError
from andrea.daemon.runtime.cliargs import run_dir_path

#: Every subcommand, in the order `andreactl --help` lists them.
COMMANDS: tuple[Command, ...] = (
    status.STATUS,
    trainer_requests.CHECKPOINT,
    trainer_requests.STOP,
    pivot.PIVOT,
    checkpoints.CHECKPOINTS,
    checkpoints.PRUNE,
    history.HISTORY,
    history.SAMPLES,
    status.WATCH,
    observability.PLOT,
    observability.METRICS,
    plan.PLAN,
    plan.SIZE,
    tokenizer.TOKENIZER,
    tools.EXPORT,
    generate.GENERATE,
    tools.VERIFY_RESUME,
    tools.SCHEMA,
)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and shows each option's default, when it has a meaningful one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse with systemctl's manners: an option is taken only as spelled (never abbreviated:
    `--la` is not `--last`, so adding an option never changes what a script meant), a misspelled
    command gets a suggestion, and an error is raised to main, which reports it (as JSON too)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str) -> NoReturn:
        wrong = re.search(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if wrong:
            names = [c.name for c in COMMANDS]
            close = difflib.get_close_matches(wrong.group(1), names, n=1)
            message = f"unknown command {wrong.group(1)!r}" + (
                f"; did you mean {close[0]!r}?" if close else f" (commands: {', '.join(names)})"
            )
        raise UsageError(self, message)


def _epilog(command: Command | None) -> str:
    if command:
        codes = [f"  {code}  {meaning}" for code, meaning in EXIT_CODES + command.extra_exit_codes]
    else:  # every command's codes: those all share, then each command's own
        codes = [f"  {code}  {meaning}" for code, meaning in EXIT_CODES] + [
            f"  {code}  {c.name}: {meaning}"
            for c in COMMANDS
            for code, meaning in c.extra_exit_codes
        ]
    examples = (
        command.examples
        if command
        else (
            "andreactl status --run-dir runs/r1",
            "andreactl plot --run-dir runs/r1 --out run.png",
            "andreactl COMMAND --help",
        )
    )
    return "\n".join(["exit codes:", *codes, "", "examples:"] + [f"  {e}" for e in examples])


def _add_global_options(parser: argparse.ArgumentParser, in_command: bool) -> None:
    # In a command's parser the defaults are SUPPRESS, so that a value given before the command
    # is not reset by the command's own copy of the option.
    unset = argparse.SUPPRESS if in_command else None
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--run-dir",
        type=run_dir_path,
        default=unset,
        help=f"the run directory (default: ${RUN_DIR_ENV})",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if in_command else False,
        help="print the command's report as one JSON document on stdout (schema: andreactl schema)",
    )
    group.add_argument(
        "-o",
        dest="output_format",
        choices=("text", "json"),
        default=unset,
        help="output format; -o json is --json",
    )


def build_parser() -> argparse.ArgumentParser:
    """andreactl's parser: the global options and one subparser per row of :data:`COMMANDS`."""
    try:
        v = version("andrea")
    except PackageNotFoundError:
        v = "unknown"
    parser = _Parser(
        prog="andreactl",
        description="Operate an ANDREA training run.",
        epilog=_epilog(None),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"andreactl {v}")
    _add_global_options(parser, in_command=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            epilog=_epilog(command),
            formatter_class=_HelpFormatter,
        )
        command.add_arguments(sub)
        _add_global_options(sub, in_command=True)
        sub.set_defaults(command_entry=command, command_parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `andreactl` script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as e:
        return usage_error(e, argv, [c.name for c in COMMANDS])
    command: Command = args.command_entry
    sub: argparse.ArgumentParser = args.command_parser
    args.json = args.json or args.output_format == "json"
    # The environment stands in for --run-dir only where a run directory is needed: a default
    # must never break a command that has no use for it (verify-resume --problem mini).
    try:
        if command.needs_run_dir and args.run_dir is None and os.environ.get(RUN_DIR_ENV):
            try:
                args.run_dir = run_dir_path(os.environ[RUN_DIR_ENV])
            except argparse.ArgumentTypeError as e:
                sub.error(f"${RUN_DIR_ENV}: {e}")
        if command.needs_run_dir:
            if args.run_dir is None:
                sub.error(f"{command.name} needs --run-dir DIR (or ${RUN_DIR_ENV})")
            if not args.run_dir.is_dir():
                raise UserError(f"{args.run_dir}: no such run directory")
        return command.run(args, sub)
    except UsageError as e:
        return usage_error(e, argv, [c.name for c in COMMANDS], command.name)
    except BrokenPipeError:
        # The reader went away (`andreactl history | head`): nothing to report, and nothing more
        # may be written to stdout, not even at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except CommandFailed as e:
        return failed(args.json, command.name, str(e), e.code)
    except (UserError, LossLogError, SocketDirError, FileRejected, OSError) as e:
        # A person's mistake or an unreadable file: one line, no traceback.
        return failed(args.json, command.name, str(e), EXIT_USAGE)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
