"""``andreactl checkpoints`` and ``prune``: the run's checkpoints (step, trigger, size, age, whether
they verify), and removing old ones (:mod:`andrea.daemon.checkpoint.catalog`)."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import TYPE_CHECKING

from andrea.control import reports
from andrea.control.commands.conventions import EXIT_OK, Command, UserError, emit
from andrea.control.commands.formatting import ago, human_bytes

if TYPE_CHECKING:
    from andrea.daemon.checkpoint.catalog import Entry


def _checkpoints_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="check manifests and sizes only, without hashing every payload",
    )


def _inventory(args: argparse.Namespace, verify: bool) -> list[Entry]:
    # The checkpoint code imports torch: only these two commands pay for it.
    from andrea.daemon.checkpoint.catalog import inventory

    def progress(i: int, n: int, step: int) -> None:
        if verify and sys.stderr.isatty():
            print(f"\rverifying {i + 1}/{n} (step {step})…", end="", file=sys.stderr, flush=True)

    entries = inventory(args.run_dir, verify=verify, progress=progress)
    if verify and sys.stderr.isatty():
        print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    return entries


def _entry_row(e: Entry, now: datetime) -> str:
    note = " (pivot boundary)" if e.pivot_boundary else ""
    age = e.age_seconds(now)
    return f"{e.step:>10} {e.trigger:<9} {human_bytes(e.bytes):>9} {ago(age):>9}  {e.state}{note}"


def cmd_checkpoints(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Every checkpoint of the run: step, trigger, size, age and whether it verifies."""
    entries = _inventory(args, verify=not args.quick)
    now = reports.utc_now()
    total = sum(e.bytes for e in entries)
    report = reports.CheckpointsReport(
        time=now,
        checkpoints=[
            reports.CheckpointRow(
                step=e.step,
                trigger=e.trigger,
                bytes=e.bytes,
                created=e.created_utc,
                state=e.state,
                intact=e.intact,
                pivot_boundary=e.pivot_boundary,
            )
            for e in entries
        ],
        total_bytes=total,
    )
    text = "\n".join(
        [f"{'step':>10} {'trigger':<9} {'size':>9} {'age':>9}  state"]
        + [_entry_row(e, now) for e in entries]
        + [f"{len(entries)} checkpoints, {human_bytes(total)}"]
    )
    emit(args, report, text)
    return EXIT_OK


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-latest",
        type=int,
        default=2,
        help="keep this many of the newest checkpoints, whatever their trigger (default 2)",
    )
    parser.add_argument(
        "--steps", help="remove only these steps (comma-separated) instead of all older ones"
    )
    parser.add_argument(
        "--include-boundaries", action="store_true", help="pivot boundaries may be removed too"
    )
    parser.add_argument(
        "--include-newest",
        action="store_true",
        help="the newest intact checkpoint (the resume point) may be removed too",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would go; remove nothing")


def _steps(args: argparse.Namespace) -> set[int] | None:
    """The steps of --steps, or None for all older ones."""
    try:
        # An empty --steps (an unset shell variable) names no step: never "all older ones".
        return {int(x) for x in args.steps.split(",")} if args.steps is not None else None
    except ValueError:
        raise UserError(
            f"--steps takes step numbers separated by commas, not {args.steps!r}"
        ) from None


def cmd_prune(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Remove old checkpoints (audit points included), never the newest intact one or a pivot
    boundary unless told to. Damaged ones are left for inspection."""
    # Torch, through the checkpoint code, as for _inventory.
    from andrea.daemon.checkpoint.catalog import plan_prune, prune

    if args.keep_latest < 0:
        raise UserError("--keep-latest must be >= 0")
    steps = _steps(args)
    entries = _inventory(args, verify=True)
    if steps is not None and (unknown := steps - {e.step for e in entries}):
        raise UserError(f"no checkpoint for step(s) {', '.join(map(str, sorted(unknown)))}")
    plan = plan_prune(
        entries, args.keep_latest, steps, args.include_boundaries, args.include_newest
    )
    now = reports.utc_now()
    size = sum(e.bytes for e in plan.remove)
    freed = size if args.dry_run else prune(args.run_dir, plan)
    lines = ["would remove:" if args.dry_run else "removed:"]
    lines += [_entry_row(e, now) for e in plan.remove] or ["  nothing"]
    lines += ["kept:"] + [f"{s:>10}  {why}" for s, why in sorted(plan.keep.items(), reverse=True)]
    lines.append(f"{len(plan.remove)} checkpoints, {human_bytes(freed)}")
    report = reports.PruneReport(
        time=now,
        dry_run=args.dry_run,
        removed=[e.step for e in plan.remove],
        kept=plan.keep,
        bytes=freed,
    )
    emit(args, report, "\n".join(lines))
    return EXIT_OK


CHECKPOINTS = Command(
    "checkpoints",
    "every checkpoint: step, trigger, size, age, verified (pivot boundaries marked)",
    _checkpoints_arguments,
    cmd_checkpoints,
    examples=("andreactl checkpoints --run-dir runs/r1",),
)
PRUNE = Command(
    "prune",
    "remove old checkpoints; never the newest intact one or a pivot boundary unless told",
    _prune_arguments,
    cmd_prune,
    examples=(
        "andreactl prune --run-dir runs/r1 --keep-latest 2 --dry-run",
        "andreactl prune --run-dir runs/r1 --steps 35,1200",
    ),
)
