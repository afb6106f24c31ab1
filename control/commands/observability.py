"""``andreactl plot`` and ``metrics export``: the run's canonical curve drawn as the audit plot
(:mod:`andrea.control.plot`) or rebuilt as metrics for TensorBoard, CSV or JSON Lines
(:mod:`andrea.daemon.metrics`); see docs/observability.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from andrea.control import reports
from andrea.control.commands.conventions import EXIT_OK, Command, CommandFailed, UserError, emit
from andrea.daemon.metrics import files
from andrea.daemon.metrics.tensorboard import export_tensorboard
from andrea.daemon.rundir.evallog import canonical_evals, read_evals
from andrea.daemon.rundir.layout import EVAL_FILE, LOSS_FILE
from andrea.daemon.rundir.losslog import LossCurve, read_curve
from andrea.protocol.evalentry import EvalEntry


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, required=True, help="file to write: .png, .svg or .pdf (by extension)"
    )
    parser.add_argument("--since", type=int, help="first step shown (default: the first logged)")
    parser.add_argument("--until", type=int, help="last step shown (default: the last logged)")
    parser.add_argument("--title", help="title above the panels (default: the run directory)")
    parser.add_argument(
        "--dpi", type=int, default=110, help="pixels per inch of a PNG (the figure is 12 in wide)"
    )


def cmd_plot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The audit plot of the canonical curve: loss + EMA, arm shares with policy bands, LR, and marks
    for restarts, pivots, audit checkpoints and zombie arms (see andrea.control.plot)."""
    # matplotlib, and the run's events (the mixing policy's and the bandit's models, tens of
    # milliseconds): only this command pays for them.
    from andrea.control.plot import FORMATS, audit_figure, save_figure, select_steps
    from andrea.control.run_events import read_run_events

    if args.out.suffix.lower().lstrip(".") not in FORMATS:
        parser.error(f"--out {args.out}: the extension must be one of .png, .svg, .pdf")
    curve = read_curve(args.run_dir / LOSS_FILE)
    if not curve:
        raise CommandFailed(f"{args.run_dir / LOSS_FILE} has no entries yet")
    events = read_run_events(args.run_dir, curve)
    evals = _canonical_evals(args.run_dir)
    for problem in events.problems:
        print(f"andreactl: warning: {problem}", file=sys.stderr)
    try:
        fig = audit_figure(
            curve,
            events,
            args.title or str(args.run_dir),
            since=args.since,
            until=args.until,
            evals=evals,
        )
    except ValueError as e:
        raise CommandFailed(str(e)) from None
    save_figure(fig, args.out, args.dpi)
    shown = len(select_steps(curve, args.since, args.until))
    emit(
        args,
        reports.PlotReport(
            out=str(args.out),
            steps=shown,
            restarts=[s for s, _ in events.restarts],
            pivots=[p.step for p in events.pivots],
            audit_checkpoints=[s for s, _ in events.audit_checkpoints],
            zombies=[z.arm for z in events.zombies],
        ),
        f"wrote {args.out} ({shown} steps)",
    )
    return EXIT_OK


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=("export",), help="export: rebuild the metrics from .loss.json"
    )
    parser.add_argument(
        "--format",
        choices=("tensorboard", "csv", "jsonl"),
        required=True,
        help="tensorboard: an event-file directory; csv, jsonl: one row per step",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="tensorboard: a new or empty directory; csv, jsonl: a new file",
    )


def _canonical_evals(run_dir: Path) -> list[EvalEntry]:
    """The run's held-out evaluations, one per step; none when it has no .eval.json."""
    path = run_dir / EVAL_FILE
    if not path.exists() and not path.is_symlink():
        return []
    return canonical_evals(read_evals(path))


def _tensorboard(curve: LossCurve, evals: list[EvalEntry], out: Path) -> int:
    def progress(done: int, total: int) -> None:
        print(f"metrics: {done:,}/{total:,} events written", file=sys.stderr, flush=True)

    try:
        return export_tensorboard(curve, out, progress, evals)
    except ValueError as e:  # tensorboardX is not installed
        raise UserError(str(e)) from None


def cmd_metrics(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Rebuild the run's metrics (loss, EMA, LR, tokens/s, phase, segment, arm shares, per-arm
    loss) from the canonical curve in .loss.json, and for TensorBoard the held-out losses of
    .eval.json, for any run, past or running (see andrea.daemon.metrics)."""
    out: Path = args.out
    # A link, even one pointing nowhere, is never written through: it could point anywhere.
    if out.is_symlink():
        parser.error(f"--out {out}: is a symbolic link (nothing is written through one)")
    if args.format == "tensorboard":
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            parser.error(f"--out {out}: must be a new or empty directory")
    elif out.exists():
        parser.error(f"--out {out}: already exists (nothing is overwritten)")
    curve = read_curve(args.run_dir / LOSS_FILE)
    evals: list[EvalEntry] = []
    if args.format == "tensorboard":
        evals = _canonical_evals(args.run_dir)
        n = _tensorboard(curve, evals, out)
    else:
        n = (files.write_csv if args.format == "csv" else files.write_jsonl)(curve, out)
    held_out = f" and {len(evals):,} held-out evaluations" if evals else ""
    emit(
        args,
        reports.MetricsReport(format=args.format, out=str(out), steps=n, evaluations=len(evals)),
        f"wrote {n:,} steps{held_out} as {args.format} to {out}",
    )
    return EXIT_OK


PLOT = Command(
    "plot",
    "the audit plot (loss, per-arm loss, arm shares, held-out, LR, run events) as PNG/SVG/PDF",
    _plot_arguments,
    cmd_plot,
    examples=(
        "andreactl plot --run-dir runs/r1 --out run.png",
        "andreactl plot --run-dir runs/r1 --out zoom.svg --since 100000 --until 120000",
    ),
)
METRICS = Command(
    "metrics",
    "export the run's metrics for TensorBoard, CSV or JSON Lines",
    _metrics_arguments,
    cmd_metrics,
    examples=(
        "andreactl metrics export --run-dir runs/r1 --format tensorboard --out tb/r1",
        "andreactl metrics export --run-dir runs/r1 --format csv --out r1.csv",
    ),
)
