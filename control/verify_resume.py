"""Resume verification: prove, with fresh processes, that stopping and resuming changes nothing.

Four paths run as separate processes: *continuous* (all updates in one life), *stop* (the first part,
then a checkpoint), *full resume* (a new process continues from that checkpoint) and *no-RNG resume*
(the same, deliberately without restoring the random generators). The full resume must reproduce the
continuous run within the tolerance in everything that decides the trajectory (consumed rows, learning
rates, losses, weights after every step, optimizer and scheduler state, progress, evaluation, the next
random draws); the no-RNG resume must diverge, which proves the comparison can see an incomplete
resume even when weights and step numbers look right.

    python -m andrea.control.verify_resume --output runs/proof [--problem mini]

Writes ``OUTPUT/verification.json`` and prints a table. Exit codes: 0 the full resume matches and the
negative case diverges; 1 a comparison or check failed; 2 the verification could not be completed (a
path failed, a file is missing or corrupt, the output directory exists).

A problem plugs in as a function ``(output, sabotage, reuse) -> exit code`` in :data:`PROBLEMS`: it runs
its paths with :func:`run_path`, compares with :mod:`andrea.control.compare`, and hands a
:class:`VerificationReport` to :func:`finish`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.control import mini_problem as mini
from andrea.control.compare import Comparison, compare_all
from andrea.daemon.durable import atomic_write_bytes

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_INCOMPLETE = 2

REPORT_NAME = "verification.json"
REPORT_FORMAT = "andrea-resume-verification/1"

CONTINUOUS = "continuous"
STOP = "stop"
FULL_RESUME = "full_resume"
NO_RNG_RESUME = "no_rng_resume"

#: The seed's CPU protocol: absolute 1e-12, relative 0. Part of this exercise, not a rule for all models.
MINI_ATOL = 1e-12
MINI_TOTAL_STEPS = 10
MINI_STOP_STEP = 5
#: A path of the mini problem takes a few seconds; this only stops a hung one.
PATH_TIMEOUT_S = 300


class VerificationIncomplete(Exception):
    """The verification could not be carried out; the message says what is missing."""


class _Record(BaseModel):
    # A non-finite figure is written as NaN/Infinity (not null), so the report reads back as it was.
    model_config = ConfigDict(ser_json_inf_nan="constants")


class Tolerance(_Record):
    absolute: float
    relative: float = 0.0


class PathRecord(_Record):
    """How one path was obtained."""

    name: str
    command: list[str]
    output_dir: str
    exit_code: int | None = Field(description="None when the path was reused rather than run here.")
    seconds: float | None
    log_file: str | None
    reused_from: str | None = None


class Check(_Record):
    """A protocol expectation that is not a comparison between two paths."""

    path: str
    name: str
    passed: bool
    detail: str


class PathFigures(_Record):
    """The headline figures of one path that ran to the last step."""

    eval_mse: float
    eval_mse_diff_vs_continuous: float
    max_weight_diff_vs_continuous: float
    next_lr: float


class VerificationReport(_Record):
    """``verification.json``: the verdict and every figure behind it."""

    format: Literal["andrea-resume-verification/1"] = REPORT_FORMAT
    problem: str
    completed: bool
    error: str | None = None
    all_checks_passed: bool = False
    positive: bool = Field(default=False, description="The stop path and the full resume reproduce the continuous run.")
    negative_divergence_detected: bool = Field(
        default=False, description="The no-RNG resume diverges, with a usable output."
    )
    tolerance: Tolerance
    sabotage: str | None
    stop_step: int
    final_step: int
    paths: list[PathRecord] = []
    checks: list[Check] = []
    stop_path: list[Comparison] = Field(default=[], description="Steps up to the stop, stop path vs continuous.")
    full_resume: list[Comparison] = Field(default=[], description="Full resume vs continuous.")
    no_rng_resume: list[Comparison] = Field(default=[], description="No-RNG resume vs continuous.")
    figures: dict[str, PathFigures] = {}
    seconds: float = 0.0


# --- generic engine -----------------------------------------------------------------------------------


def run_path(name: str, argv: Sequence[str], output_dir: Path, log_dir: Path, index: int, total: int) -> PathRecord:
    """Run one path as a fresh process, its output in ``log_dir/NAME.log``; raise if it fails."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{name}.log"
    print(f"[{index}/{total}] {name:<14} python {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    with open(log_file, "xb") as log_handle:
        try:
            completed = subprocess.run(
                list(argv), stdout=log_handle, stderr=subprocess.STDOUT, timeout=PATH_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise VerificationIncomplete(
                f"path {name} did not finish within {PATH_TIMEOUT_S} s (log: {log_file})"
            ) from exc
    seconds = time.monotonic() - started
    if completed.returncode != 0:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-10:])
        raise VerificationIncomplete(f"path {name} exited with {completed.returncode} (log: {log_file}):\n{tail}")
    print(f"      {name:<14} ok ({seconds:.1f} s)", flush=True)
    return PathRecord(
        name=name,
        command=list(argv),
        output_dir=str(output_dir),
        exit_code=completed.returncode,
        seconds=round(seconds, 3),
        log_file=str(log_file),
    )


def verdict(report: VerificationReport) -> VerificationReport:
    """Fill in positive / negative / all_checks_passed from the comparisons and checks."""
    positive_paths = {CONTINUOUS, STOP, FULL_RESUME}
    positive = (
        bool(report.full_resume)
        and all(c.passed for c in report.stop_path + report.full_resume)
        and all(c.passed for c in report.checks if c.path in positive_paths)
    )
    negative = (
        bool(report.no_rng_resume)
        and all(c.sound for c in report.no_rng_resume)
        and any(c.diverged for c in report.no_rng_resume)
        and all(c.passed for c in report.checks if c.path not in positive_paths)
    )
    return report.model_copy(
        update={
            "positive": positive,
            "negative_divergence_detected": negative,
            "all_checks_passed": report.completed and positive and negative,
        }
    )


def finish(report: VerificationReport, output: Path) -> int:
    """Write ``verification.json``, print the table and return the exit code."""
    atomic_write_bytes(output / REPORT_NAME, report.model_dump_json(indent=2).encode())
    print_table(report)
    print(f"report: {output / REPORT_NAME}")
    if not report.completed:
        return EXIT_INCOMPLETE
    return EXIT_OK if report.all_checks_passed else EXIT_MISMATCH


def _fmt(value: float) -> str:
    return "0" if value == 0 else f"{value:.6g}"


def print_table(report: VerificationReport) -> None:
    """The human-readable summary of a report."""
    print()
    if report.error:
        print(f"VERIFICATION INCOMPLETE: {report.error}")
    width = max([len(c.name) for c in report.stop_path + report.full_resume] + [20])
    if report.stop_path:
        print(f"{'stop path vs continuous':<{width}}  {'max |diff|':>12}  ok")
        for c in report.stop_path:
            print(f"{c.name:<{width}}  {_fmt(c.max_abs_diff):>12}  {'yes' if c.passed else 'NO ' + _problems(c)}")
        print()
    negatives = {c.name: c for c in report.no_rng_resume}
    if report.full_resume:
        print(f"{'quantity':<{width}}  {'full resume':>12}  {'match':<5}  {'no-RNG':>12}  differs")
        for c in report.full_resume:
            n = negatives.get(c.name)
            match = "yes" if c.passed else "NO"
            differs = (
                "-" if n is None else ("yes" if n.diverged else ("no" if n.passed else "UNUSABLE " + _problems(n)))
            )
            n_diff = "-" if n is None else _fmt(n.max_abs_diff)
            print(f"{c.name:<{width}}  {_fmt(c.max_abs_diff):>12}  {match:<5}  {n_diff:>12}  {differs}")
        print()
    for name, f in report.figures.items():
        print(
            f"{name:<14} eval MSE {f.eval_mse!r}  (diff vs continuous {_fmt(f.eval_mse_diff_vs_continuous)}), "
            f"max weight diff {_fmt(f.max_weight_diff_vs_continuous)}, "
            f"next lr after step {report.final_step} {f.next_lr!r}"
        )
    failed = [c for c in report.checks if not c.passed]
    print(f"protocol checks: {len(report.checks) - len(failed)}/{len(report.checks)} passed")
    for c in failed:
        print(f"  FAILED {c.path}: {c.name}: {c.detail}")
    print(
        f"positive (full resume matches within {report.tolerance.absolute:g}): {'yes' if report.positive else 'NO'}; "
        f"negative divergence detected: {'yes' if report.negative_divergence_detected else 'NO'}; "
        f"all checks passed: {'yes' if report.all_checks_passed else 'NO'}"
        + (f"  [sabotage: {report.sabotage}]" if report.sabotage else "")
    )


def _problems(c: Comparison) -> str:
    return "(" + ", ".join(f"{kind.value} {n}" for kind, n in c.counts.items()) + ")"


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise VerificationIncomplete(f"{path}: missing") from exc
    except (OSError, ValueError) as exc:
        raise VerificationIncomplete(f"{path}: unreadable: {exc}") from exc


# --- the mini problem ---------------------------------------------------------------------------------


def _mini_command(steps: int, output_dir: Path, resume: Path | None = None, *extra: str) -> list[str]:
    argv = [
        sys.executable,
        "-B",
        "-m",
        "andrea.control.mini_problem",
        "train",
        "--steps",
        str(steps),
        "--output",
        str(output_dir),
    ]
    if resume is not None:
        argv += ["--resume", str(resume)]
    return argv + list(extra)


def _load_mini_summary(path_dir: Path) -> dict[str, Any]:
    """The raw summary (compared as written), after checking its schema and its checkpoint's fingerprint."""
    raw = _load_json(path_dir / mini.SUMMARY_NAME)
    try:
        summary = mini.MiniSummary.model_validate(raw)
    except ValidationError as exc:
        raise VerificationIncomplete(f"{path_dir / mini.SUMMARY_NAME}: not a mini summary: {exc}") from exc
    checkpoint = path_dir / summary.checkpoint.file
    fingerprint = path_dir / (summary.checkpoint.file + ".sha256")
    if not (checkpoint.is_file() and fingerprint.is_file()):
        raise VerificationIncomplete(f"{checkpoint}: missing, or its fingerprint {fingerprint.name} is")
    actual = _sha256_file(checkpoint)
    if (
        actual != summary.checkpoint.sha256
        or f"{actual}  {checkpoint.name}" not in fingerprint.read_text(errors="replace").splitlines()
    ):
        raise VerificationIncomplete(f"{checkpoint}: sha256 {actual} does not match its summary and fingerprint file")
    return raw


def _mini_reused(reuse: Path) -> VerificationReport:
    report_path = reuse / REPORT_NAME
    try:
        earlier = VerificationReport.model_validate(_load_json(report_path))
    except ValidationError as exc:
        raise VerificationIncomplete(f"{report_path}: not a verification report: {exc}") from exc
    if earlier.problem != "mini" or earlier.sabotage is not None or not earlier.all_checks_passed:
        raise VerificationIncomplete(f"{report_path}: only a passed, unsabotaged mini verification can be reused")
    return earlier


def _mini_paths(
    output: Path, sabotage: str | None, reuse: Path | None
) -> tuple[list[PathRecord], dict[str, dict[str, Any]]]:
    logs = output / "logs"
    records: list[PathRecord] = []
    if reuse is None:
        source = output
        records.append(
            run_path(CONTINUOUS, _mini_command(MINI_TOTAL_STEPS, output / CONTINUOUS), output / CONTINUOUS, logs, 1, 4)
        )
        records.append(run_path(STOP, _mini_command(MINI_STOP_STEP, output / STOP), output / STOP, logs, 2, 4))
    else:
        source = reuse
        earlier = {record.name: record for record in _mini_reused(reuse).paths}
        for name in (CONTINUOUS, STOP, NO_RNG_RESUME):
            print(f"[-/4] {name:<14} reused from {reuse / name}", flush=True)
            records.append(earlier[name].model_copy(update={"reused_from": str(reuse / name)}))
    stop_checkpoint = source / STOP / mini.CHECKPOINT_NAME
    extra = ["--sabotage", sabotage] if sabotage else []
    resume_steps = MINI_TOTAL_STEPS - MINI_STOP_STEP
    records.append(
        run_path(
            FULL_RESUME,
            _mini_command(resume_steps, output / FULL_RESUME, stop_checkpoint, *extra),
            output / FULL_RESUME,
            logs,
            3,
            4,
        )
    )
    if reuse is None:
        command = _mini_command(resume_steps, output / NO_RNG_RESUME, stop_checkpoint, "--omit-rng-restore")
        records.append(run_path(NO_RNG_RESUME, command, output / NO_RNG_RESUME, logs, 4, 4))
    summaries = {
        CONTINUOUS: _load_mini_summary(source / CONTINUOUS),
        STOP: _load_mini_summary(source / STOP),
        FULL_RESUME: _load_mini_summary(output / FULL_RESUME),
        NO_RNG_RESUME: _load_mini_summary(source / NO_RNG_RESUME),
    }
    return records, summaries


def _steps(history: list[dict[str, Any]], key: str) -> list[Any]:
    return [record[key] for record in history]


def _per_step_quantities(
    reference: list[dict[str, Any]], candidate: list[dict[str, Any]], label: str
) -> dict[str, tuple[Any, Any]]:
    return {
        f"step numbers and epochs ({label})": (
            [(r["step"], r["epoch"]) for r in reference],
            [(r["step"], r["epoch"]) for r in candidate],
        ),
        f"row ids consumed ({label})": (_steps(reference, "row_ids"), _steps(candidate, "row_ids")),
        f"learning rates ({label})": (_steps(reference, "lr"), _steps(candidate, "lr")),
        f"losses ({label})": (_steps(reference, "loss"), _steps(candidate, "loss")),
        f"random gains and noise ({label})": (
            [(r["gain"], r["noise"]) for r in reference],
            [(r["gain"], r["noise"]) for r in candidate],
        ),
        f"parameters after each step ({label})": (
            _steps(reference, "parameters_after"),
            _steps(candidate, "parameters_after"),
        ),
    }


def _identity(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: summary.get(key) for key in ("config", "code_version", "data_identity", "versions")}


def _mini_resume_quantities(
    continuous: dict[str, Any], stop: dict[str, Any], resumed: dict[str, Any]
) -> dict[str, tuple[Any, Any]]:
    label = f"steps {MINI_STOP_STEP + 1}-{MINI_TOTAL_STEPS}"
    quantities = _per_step_quantities(
        continuous["history"][MINI_STOP_STEP:], resumed["history"][MINI_STOP_STEP:], label
    )
    quantities.update(
        {
            f"history carried from the checkpoint (steps 1-{MINI_STOP_STEP})": (
                stop["history"],
                resumed["history"][:MINI_STOP_STEP],
            ),
            "final parameters": (continuous["final_parameters"], resumed["final_parameters"]),
            "optimizer state": (continuous["optimizer_state"], resumed["optimizer_state"]),
            "scheduler state": (continuous["scheduler_state"], resumed["scheduler_state"]),
            "progress (step, epoch, cursor, order)": (continuous["progress"], resumed["progress"]),
            "eval MSE": (continuous["eval_mse"], resumed["eval_mse"]),
            f"next lr after step {MINI_TOTAL_STEPS}": (continuous["next_lr"], resumed["next_lr"]),
            "next draws: Python random": (
                continuous["next_draws"]["python_random"],
                resumed["next_draws"]["python_random"],
            ),
            "next draws: NumPy PCG64": (continuous["next_draws"]["numpy_pcg64"], resumed["next_draws"]["numpy_pcg64"]),
            "next draws: torch CPU": (continuous["next_draws"]["torch_cpu"], resumed["next_draws"]["torch_cpu"]),
            "config, code, data, versions": (_identity(continuous), _identity(resumed)),
        }
    )
    return quantities


def _mini_checks(summaries: dict[str, dict[str, Any]], stop_sha256: str) -> list[Check]:
    config = mini.MiniConfig()
    checks: list[Check] = []

    def check(path: str, name: str, passed: bool, detail: str) -> None:
        checks.append(Check(path=path, name=name, passed=passed, detail=detail))

    def progress_is(path: str, step: int) -> None:
        progress = summaries[path]["progress"]
        rows = step * config.batch_size
        # A new order is drawn when a batch needs it, so a finished epoch leaves the cursor at n_rows.
        epoch = (rows - 1) // config.n_rows
        expected = (step, epoch, rows - epoch * config.n_rows)
        actual = (progress["step"], progress["epoch"], progress["cursor"])
        check(path, "progress (step, epoch, cursor)", actual == expected, f"{actual}, expected {expected}")

    def rows_once_per_epoch(path: str) -> None:
        history = summaries[path]["history"]
        by_epoch: dict[int, list[int]] = {}
        for record in history:
            by_epoch.setdefault(record["epoch"], []).extend(record["row_ids"])
        repeated = {
            epoch: len(rows) - len(set(rows)) for epoch, rows in by_epoch.items() if len(rows) != len(set(rows))
        }
        steps = [record["step"] for record in history]
        passed = not repeated and steps == list(range(1, len(steps) + 1))
        check(
            path,
            "every step once, no row skipped or repeated within an epoch",
            passed,
            f"steps {steps[:1]}..{steps[-1:]}, repeated rows per epoch {repeated}",
        )

    progress_is(CONTINUOUS, MINI_TOTAL_STEPS)
    rows_once_per_epoch(CONTINUOUS)
    progress_is(STOP, MINI_STOP_STEP)
    check(
        STOP,
        "stops mid-epoch",
        0 < summaries[STOP]["progress"]["cursor"] < config.n_rows,
        f"cursor {summaries[STOP]['progress']['cursor']} of {config.n_rows}",
    )
    crossed = {record["epoch"] for record in summaries[CONTINUOUS]["history"][MINI_STOP_STEP:]}
    check(
        CONTINUOUS,
        "the resumed steps cross into a new data order",
        len(crossed) > 1,
        f"epochs of steps {MINI_STOP_STEP + 1}-{MINI_TOTAL_STEPS}: {sorted(crossed)}",
    )
    for path, rng_restored in ((FULL_RESUME, True), (NO_RNG_RESUME, False)):
        summary = summaries[path]
        progress_is(path, MINI_TOTAL_STEPS)
        rows_once_per_epoch(path)
        expected_run = list(range(MINI_STOP_STEP + 1, MINI_TOTAL_STEPS + 1))
        check(
            path,
            "ran exactly the steps after the stop",
            summary["steps_run"] == expected_run,
            f"{summary['steps_run']}, expected {expected_run}",
        )
        resumed = summary["resumed"] or {}
        check(
            path,
            "resumed from the stop path's checkpoint",
            resumed.get("sha256") == stop_sha256 and resumed.get("step") == MINI_STOP_STEP,
            f"sha256 {resumed.get('sha256')} at step {resumed.get('step')}",
        )
        check(
            path,
            "random generators restored" if rng_restored else "random generators deliberately not restored",
            resumed.get("rng_restored") is rng_restored,
            f"rng_restored={resumed.get('rng_restored')}",
        )
    return checks


def _mini_figures(
    summaries: dict[str, dict[str, Any]], comparisons: dict[str, list[Comparison]]
) -> dict[str, PathFigures]:
    reference_mse = summaries[CONTINUOUS]["eval_mse"]
    figures = {}
    for path in (CONTINUOUS, FULL_RESUME, NO_RNG_RESUME):
        weights = next((c.max_abs_diff for c in comparisons.get(path, []) if c.name == "final parameters"), 0.0)
        mse = summaries[path]["eval_mse"]
        figures[path] = PathFigures(
            eval_mse=mse,
            eval_mse_diff_vs_continuous=abs(mse - reference_mse),
            max_weight_diff_vs_continuous=weights,
            next_lr=summaries[path]["next_lr"],
        )
    return figures


def run_mini(output: Path, sabotage: str | None = None, reuse: Path | None = None) -> int:
    """Verify the mini problem's resume into the new directory ``output``; returns the exit code.

    ``sabotage`` breaks the full resume on purpose (see ``mini_problem.SABOTAGES``): the verification
    must then fail. ``reuse`` takes the continuous, stop and no-RNG paths from an earlier passed
    verification directory instead of running them again, so that a changed resume path can be judged
    against evidence that already exists; only the full resume runs.
    """
    if output.exists() or output.is_symlink():
        print(
            f"refused: {output} already exists; choose a new directory (earlier evidence is never overwritten)",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    if sabotage is not None and sabotage not in mini.SABOTAGES:
        print(f"unknown sabotage {sabotage!r}; known: {', '.join(mini.SABOTAGES)}", file=sys.stderr)
        return EXIT_INCOMPLETE
    output.mkdir(parents=True)
    started = time.monotonic()
    report = VerificationReport(
        problem="mini",
        completed=False,
        tolerance=Tolerance(absolute=MINI_ATOL),
        sabotage=sabotage,
        stop_step=MINI_STOP_STEP,
        final_step=MINI_TOTAL_STEPS,
    )
    try:
        paths, summaries = _mini_paths(output, sabotage, reuse)
        report.paths = paths
        stop_sha256 = summaries[STOP]["checkpoint"]["sha256"]
        stop_label = f"steps 1-{MINI_STOP_STEP}"
        report.stop_path = compare_all(
            _per_step_quantities(
                summaries[CONTINUOUS]["history"][:MINI_STOP_STEP], summaries[STOP]["history"], stop_label
            ),
            MINI_ATOL,
        )
        report.full_resume = compare_all(
            _mini_resume_quantities(summaries[CONTINUOUS], summaries[STOP], summaries[FULL_RESUME]), MINI_ATOL
        )
        report.no_rng_resume = compare_all(
            _mini_resume_quantities(summaries[CONTINUOUS], summaries[STOP], summaries[NO_RNG_RESUME]), MINI_ATOL
        )
        report.checks = _mini_checks(summaries, stop_sha256)
        report.figures = _mini_figures(
            summaries, {FULL_RESUME: report.full_resume, NO_RNG_RESUME: report.no_rng_resume}
        )
        report.completed = True
    except VerificationIncomplete as exc:
        report.error = str(exc)
    report.seconds = round(time.monotonic() - started, 3)
    return finish(verdict(report), output)


#: Problem name → runner. A runner takes (output, sabotage, reuse) and returns the exit code.
PROBLEMS: dict[str, Callable[[Path, str | None, Path | None], int]] = {"mini": run_mini}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m andrea.control.verify_resume", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", type=Path, required=True, help="new directory for the paths and verification.json")
    parser.add_argument("--problem", choices=sorted(PROBLEMS), default="mini")
    parser.add_argument("--sabotage", help="break the full resume on purpose (the verification must then fail)")
    parser.add_argument("--reuse", type=Path, help="earlier passed verification whose reference paths are reused")
    args = parser.parse_args(argv)
    return PROBLEMS[args.problem](args.output, args.sabotage, args.reuse)


if __name__ == "__main__":
    sys.exit(main())
