"""``andreactl history`` and ``samples``: what the run logged, from its files (the canonical loss
curve of ``.loss.json``, the held-out evaluations of ``.eval.json``, the samples of ``.samples.json``)."""

from __future__ import annotations

import argparse
import difflib
import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from andrea.control import reports
from andrea.control.commands.conventions import EXIT_OK, Command, CommandFailed, UserError, emit
from andrea.control.commands.formatting import eval_text
from andrea.daemon.metrics.series import arm_loss_ema
from andrea.daemon.mixing.proxyfiles import MAX_SAMPLES_BYTES
from andrea.daemon.rundir.boundedio import read_json
from andrea.daemon.rundir.evallog import canonical_evals, last_eval, read_evals
from andrea.daemon.rundir.layout import EVAL_FILE, LOSS_FILE, SAMPLES_FILE, pivot_records
from andrea.daemon.rundir.losslog import LossCurve, read_curve


def _stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0 or more)")
    return value


def _last_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--last", type=_count, default=20, help="how many of the newest steps (0: all)"
    )


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    _last_arguments(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--eval",
        action="store_true",
        help="the held-out evaluations (.eval.json) instead of the training loss",
    )
    which.add_argument(
        "--arm",
        metavar="NAME",
        help="only the steps trained on arm NAME: its training loss curve (--last counts its steps)",
    )


def _eval_history(args: argparse.Namespace) -> int:
    path = args.run_dir / EVAL_FILE
    if not path.exists() and not path.is_symlink():
        raise CommandFailed(f"{path} does not exist yet (evaluations come every eval.every steps)")
    evals = canonical_evals(read_evals(path))
    shown = evals[-args.last :] if args.last else evals
    names = list(dict.fromkeys(n for e in shown for n in e.arms))
    text = "\n".join(
        [f"{'step':>8} {'mean':>8} {'worst':<12}" + "".join(f" {n:>12}" for n in names) + " seg"]
        + [
            f"{e.step:>8} {e.mean_loss():>8.4f} {e.worst()[0]:<12}"
            + "".join(f" {e.arms[n].loss:>12.4f}" if n in e.arms else f" {'-':>12}" for n in names)
            + f" {e.segment:>3}"
            for e in shown
        ]
    )
    emit(args, reports.EvalHistoryReport(run_dir=str(args.run_dir), rows=shown), text)
    return EXIT_OK


def _rows_of_arm(curve: LossCurve, arm: str | None) -> np.ndarray:
    """The rows of ``curve`` trained on ``arm`` (every row for None); an arm with no row is a
    usage error naming the arms that have some."""
    if arm is None:
        return np.arange(len(curve))
    rows = np.flatnonzero(curve.arm == arm)
    if not len(rows):
        names = sorted(set(curve.arm.tolist()))
        close = difflib.get_close_matches(arm, names, n=1)
        raise UserError(
            f"--arm {arm}: no step of {LOSS_FILE} was trained on it; the arms there: "
            + (", ".join(names) or "none")
            + (f" (did you mean {close[0]!r}?)" if close else "")
        )
    return rows


def cmd_history(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The canonical loss curve (newest entry per step) from .loss.json, with each step's arm's
    loss EMA (over that arm's steps); with --arm only one arm's steps; with --eval the held-out
    evaluations from .eval.json."""
    if args.eval:
        return _eval_history(args)
    curve = read_curve(args.run_dir / LOSS_FILE)
    rows = _rows_of_arm(curve, args.arm)
    # Over the whole curve, so that --last shows the values the full history has.
    arm_ema = arm_loss_ema(curve.loss, curve.arm)
    picked = (rows[-args.last :] if args.last else rows).tolist()
    shown = [(curve.entry(i), arm_ema.item(i)) for i in picked]  # models only for these
    text = "\n".join(
        [f"{'step':>8} {'loss':>9} {'arm EMA':>9} {'lr':>9}  {'arm':<14} seg phase"]
        + [
            f"{e.step:>8} {e.loss:>9.4f} {ema:>9.4f} {e.lr:>9.2e}  {e.arm:<14} {e.segment:>3}"
            f" {e.phase:>5}"
            for e, ema in shown
        ]
    )
    if args.arm is not None:
        text += f"\narm {args.arm}: {len(rows):,} of the {len(curve):,} logged steps"
    report = reports.HistoryReport(
        run_dir=str(args.run_dir),
        arm=args.arm,
        rows=[
            reports.HistoryRow(
                **e.model_dump(
                    mode="json", include={"step", "loss", "lr", "arm", "tokens", "segment", "phase"}
                ),
                arm_loss_ema=None if math.isnan(ema) else ema,
                time=_stamp(e.wall_time),
            )
            for e, ema in shown
        ],
    )
    if (args.run_dir / EVAL_FILE).exists() and (latest := last_eval(args.run_dir / EVAL_FILE)):
        text += "\nheld-out " + eval_text(latest)
        text += " (andreactl history --eval for all)"
    emit(args, report, text)
    return EXIT_OK


def _samples_arguments(parser: argparse.ArgumentParser) -> None:
    _last_arguments(parser)
    parser.add_argument(
        "--all-phases",
        action="store_true",
        help="also the samples of earlier phases, from the pivot archives (oldest first)",
    )


def _sample_files(run_dir: Path, all_phases: bool) -> list[Path]:
    """The samples files to read, oldest phase first: each pivot archive's, then the current one."""
    archived = sorted(p.parent / SAMPLES_FILE for p in pivot_records(run_dir)) if all_phases else []
    return [p for p in archived if p.is_file()] + [run_dir / SAMPLES_FILE]


def _read_records(path: Path) -> list[dict]:
    try:
        return read_json(path, MAX_SAMPLES_BYTES)["records"]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a samples file ({e})") from None


def samples_text(records: list[dict]) -> str:
    """The records for a person: a header line per record, each sample's text as written (real
    newlines, no escapes) under a separator naming its prompt."""
    blocks = []
    for rec in records:
        mix = ", ".join(f"{arm} {n}" for arm, n in rec["arm_mix"].items()) or "none recorded"
        lines = [f"=== step {rec['step']} · segment {rec['segment']} · phase {rec['phase']} "
                 f"· steps per arm since the previous: {mix} ==="]  # fmt: skip
        for i, sample in enumerate(rec["samples"], 1):
            lines.append(f"--- sample {i} (prompt {sample['prompt']!r}) ---")
            lines.append(sample["text"])
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def cmd_samples(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The most recent generated samples, from .samples.json (and the archives: --all-phases)."""
    path = args.run_dir / SAMPLES_FILE
    if not path.exists() and not path.is_symlink():
        raise CommandFailed(
            f"{path} does not exist yet: the proxy writes it every samples.every steps; a run under "
            "--mixing fixed (no proxy) writes no .samples.json (andreactl generate makes text "
            "from any checkpoint)"
        )
    records = [
        rec for f in _sample_files(args.run_dir, args.all_phases) for rec in _read_records(f)
    ]
    records = records[-args.last :] if args.last else records
    report = reports.SamplesReport(run_dir=str(args.run_dir), records=records)
    emit(args, report, samples_text(records))
    return EXIT_OK


HISTORY = Command(
    "history",
    "the canonical loss curve from .loss.json (--arm: one arm's steps; --eval: held-out losses)",
    _history_arguments,
    cmd_history,
    examples=(
        "andreactl history --run-dir runs/r1 --last 50",
        "andreactl history --run-dir runs/r1 --arm code --last 0",
        "andreactl history --run-dir runs/r1 -o json",
    ),
)
SAMPLES = Command(
    "samples",
    "the most recent generated samples",
    _samples_arguments,
    cmd_samples,
    examples=(
        "andreactl samples --run-dir runs/r1 --last 2",
        "andreactl samples --run-dir runs/r1 --all-phases --last 0",
    ),
)
