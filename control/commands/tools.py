"""The commands that run a tool of their own rather than ask or read a live run: ``export``
(:mod:`andrea.control.export.bundle`), ``verify-resume`` (:mod:`andrea.control.verify_resume`) and
``schema`` (:mod:`andrea.control.reports`); ``plan`` and ``size`` live in :mod:`.plan`.

The first two need torch; each imports it in its own function, so that building andreactl's
parser, and every other command, stays torch-free.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import TextIO

from andrea.control import reports, verify_options
from andrea.control.commands.conventions import EXIT_OK, Command


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--step", type=int, help="export this step (default: the newest intact checkpoint)"
    )
    parser.add_argument(
        "--to", type=Path, required=True, dest="dest", help="new or empty directory for the export"
    )
    parser.add_argument(
        "--safetensors",
        action="store_true",
        help="also write the weights as model.safetensors (needs the safetensors extra)",
    )
    parser.add_argument(
        "--format",
        choices=("andrea", "hf"),
        default="andrea",
        help=(
            "hf: also DEST/hf, the Hugging Face folder to push to the Hub (config.json, "
            "model.safetensors under GPT2LMHeadModel's names, tokenizer.json, "
            "tokenizer_config.json, a model card) that transformers loads"
        ),
    )


def cmd_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Export a verified checkpoint of the run (see andrea.control.export.bundle)."""
    from andrea.control.export.bundle import run_export

    return run_export(args.run_dir, args.dest, args.step, args.json, args.safetensors, args.format)


def cmd_verify_resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the resume-verification protocol (see andrea.control.verify_resume)."""
    from andrea.control.verify_resume import run_problem
    from andrea.control.verify_resume.engine import REPORT_NAME

    if not args.json:
        return run_problem(parser, args)
    existed = args.output.exists() or args.output.is_symlink()
    # The verifier prints its progress and table for a person: keep stdout for the report alone.
    # What it says on stderr is kept too: its last line is why, when it ends without a report.
    said = _Lines(sys.stderr)
    with contextlib.redirect_stdout(sys.stderr), contextlib.redirect_stderr(said):
        code = run_problem(parser, args)
    report = args.output / REPORT_NAME
    if report.is_file() and not existed:
        print(report.read_text(encoding="utf-8"))
    else:  # refused, or stopped before a report: never an earlier run's report
        why = said.last or f"verify-resume ended with exit code {code} without a report"
        print(
            reports.ErrorReport(
                time=reports.utc_now(), command="verify-resume", exit_code=code, error=why
            ).model_dump_json(indent=1)
        )
    return code


class _Lines(io.TextIOBase):
    """A text stream that passes everything on to ``out`` and keeps the last non-empty line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.last = ""

    def write(self, text: str) -> int:
        self.out.write(text)
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last = lines[-1]
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def _schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        choices=sorted(reports.REPORTS),
        metavar="COMMAND",
        help="one command (default: all)",
    )


def cmd_schema(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The JSON Schema of a command's --json output (all commands' without a name)."""
    names = [args.name] if args.name else sorted(reports.REPORTS)
    schemas = {name: reports.report_schema(name) for name in names}
    print(json.dumps(schemas[args.name] if args.name else schemas, indent=1))
    return EXIT_OK


EXPORT = Command(
    "export",
    "a verified checkpoint with its config, metrics, load procedure and audit trail",
    _export_arguments,
    cmd_export,
    examples=(
        "andreactl export --run-dir runs/r1 --to exports/r1",
        "andreactl export --run-dir runs/r1 --step 110000 --to exports/r1-110k --safetensors",
        "andreactl export --run-dir runs/r1 --to exports/r1-hf --format hf",
    ),
)
VERIFY_RESUME = Command(
    "verify-resume",
    "prove with fresh processes that stop + resume reproduces the uninterrupted run",
    verify_options.add_arguments,
    cmd_verify_resume,
    needs_run_dir=False,
    examples=(
        "andreactl verify-resume --output /tmp/proof --problem mini",
        "andreactl verify-resume --output /tmp/proof --problem trainer --config run.toml",
        "andreactl verify-resume --output /tmp/proof --problem trainer --run-dir runs/r1",
    ),
)
SCHEMA = Command(
    "schema",
    "the JSON Schema of a command's --json output",
    _schema_arguments,
    cmd_schema,
    needs_run_dir=False,
    examples=("andreactl schema status",),
)
