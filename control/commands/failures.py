"""How andreactl reports an error: one line on stderr, as a person reads it, and with ``--json`` an
:class:`~andrea.control.reports.ErrorReport` on stdout, so a script reading stdout always gets one
document and the exit code in it."""

from __future__ import annotations

import argparse
import sys

from andrea.control.commands.conventions import EXIT_USAGE
from andrea.control.reports import ErrorReport, utc_now


class UsageError(Exception):
    """A command line the parser refuses; printed as argparse prints it, exit code 2."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


def failed(as_json: bool, command: str | None, message: str, code: int) -> int:
    """Report an error: one line on stderr and, with --json, an ErrorReport on stdout."""
    print(f"andreactl: {message}", file=sys.stderr)
    if as_json:
        report = ErrorReport(time=utc_now(), command=command, exit_code=code, error=message)
        print(report.model_dump_json(indent=1))
    return code


def usage_error(
    e: UsageError, argv: list[str], commands: list[str], command: str | None = None
) -> int:
    """Report a command line the parser refused, as argparse does and, when the command line asked
    for JSON, an ErrorReport on stdout."""
    e.parser.print_usage(sys.stderr)
    print(f"{e.parser.prog}: error: {e}", file=sys.stderr)
    if _wants_json(argv):
        command = command or next((a for a in argv if a in commands), None)
        report = ErrorReport(time=utc_now(), command=command, exit_code=EXIT_USAGE, error=str(e))
        print(report.model_dump_json(indent=1))
    return EXIT_USAGE


def _wants_json(argv: list[str]) -> bool:
    """Whether a command line the parser refused asked for JSON output."""
    head = argv[: argv.index("--")] if "--" in argv else argv
    pairs = zip(head, [*head[1:], ""], strict=True)
    return any(
        a == "--json" or a in ("-ojson", "-o=json") or (a, b) == ("-o", "json") for a, b in pairs
    )
