"""Resume verification: prove, with fresh processes, that stopping and resuming changes nothing.

Four paths run as separate processes: *continuous* (all updates in one life), *stop* (the first part,
then a checkpoint), *full resume* (a new process continues from that checkpoint) and *no-RNG resume*
(the same, deliberately without restoring the random generators). The full resume must reproduce the
continuous run within the tolerance in everything that decides the trajectory (consumed rows, learning
rates, losses, weights after every step, optimizer and scheduler state, progress, evaluation, the next
random draws); the no-RNG resume must diverge, which proves the comparison can see an incomplete
resume even when weights and step numbers look right.

    python -m andrea.control.verify_resume --output runs/proof [--problem mini|trainer]

``--problem mini`` is the seed's exercise (:mod:`andrea.control.mini_problem`, tolerance 1e-12).
``--problem trainer`` is the real ``andrea-trainer`` (tiny preset, CPU, one thread), stopped by a real
SIGTERM, compared bit for bit (tolerance 0), with a second negative control that skips the data cursors.

Writes ``OUTPUT/verification.json`` and prints a table. Exit codes: 0 the full resume matches and the
negative case diverges; 1 a comparison or check failed; 2 the verification could not be completed (a
path failed, a file is missing or corrupt, the output directory exists).

A problem plugs in as a function ``(output, options) -> exit code`` in :data:`PROBLEMS`: it runs its
paths with :func:`run_path`, compares with :mod:`andrea.control.compare`, and fills in a
:class:`VerificationReport` inside :func:`_verify`, which hands it to :func:`finish`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.control import mini_problem as mini
from andrea.control.compare import MAX_ISSUES_KEPT, Comparison, Issue, IssueKind, compare_all
from andrea.daemon.checkpoint import format as fmt
from andrea.daemon.checkpoint.durable import atomic_write_bytes
from andrea.daemon.checkpoint.manager import checkpoint_steps, verify_checkpoint
from andrea.daemon.checkpoint.manifest import LayoutEntry, Manifest
from andrea.daemon.losslog import LossLogError, canonical_curve, read_entries
from andrea.daemon.rundir import LOSS_FILE, bin_name
from andrea.protocol.lossentry import LossEntry

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_INCOMPLETE = 2

REPORT_NAME = "verification.json"
REPORT_FORMAT = "andrea-resume-verification/1"

CONTINUOUS = "continuous"
STOP = "stop"
FULL_RESUME = "full_resume"
NO_RNG_RESUME = "no_rng_resume"
NO_CURSOR_RESUME = "no_cursor_resume"

#: The seed's CPU protocol: absolute 1e-12, relative 0. Part of this exercise, not a rule for all models.
MINI_ATOL = 1e-12
MINI_TOTAL_STEPS = 10
MINI_STOP_STEP = 5
#: A path takes a few seconds; this only stops a hung one.
PATH_TIMEOUT_S = 300

#: The real trainer: tolerance 0, because the trainer promises bit-exact resumes on the same device,
#: dtype and thread count, so any difference at all is a resume bug, not rounding.
TRAINER_ATOL = 0.0
TRAINER_TOTAL_STEPS = 24
#: Cadence points at 10 and 20: the stop lands between them and the resumed segment writes step 20
#: again, so a mid-trajectory checkpoint is compared too, not only the end.
TRAINER_CHECKPOINT_EVERY = 10
#: SIGTERM goes out when this step's progress line appears. Steps take ~20 ms, so the stop lands a step
#: or two later; anything from here to step 19 is a valid stop (between cadence points, before the end).
TRAINER_SIGNAL_AFTER = 11
#: --sabotage for the trainer problem: the full resume skips this restore (the trainer's hidden
#: negative-control flag), so the verification must fail.
TRAINER_SABOTAGES = {"skip-cursor": "cursor", "skip-rng": "rng"}
#: The trainer's two negative controls and what each leaves out.
TRAINER_NEGATIVES = {NO_RNG_RESUME: "rng", NO_CURSOR_RESUME: "cursor"}


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
    signal_sent: str | None = Field(
        default=None, description="The signal the verifier sent to the path, and when."
    )


class Check(_Record):
    """A protocol expectation that is not a comparison between two paths."""

    path: str
    name: str
    passed: bool
    detail: str


class PathFigures(_Record):
    """The headline figures of one mini-problem path that ran to the last step."""

    eval_mse: float
    eval_mse_diff_vs_continuous: float
    max_weight_diff_vs_continuous: float
    next_lr: float

    def line(self, final_step: int) -> str:
        return (
            f"eval MSE {self.eval_mse!r}  (diff vs continuous {_fmt(self.eval_mse_diff_vs_continuous)}), "
            f"max weight diff {_fmt(self.max_weight_diff_vs_continuous)}, "
            f"next lr after step {final_step} {self.next_lr!r}"
        )


class TrainerFigures(_Record):
    """The headline figures of one trainer path that ran to the last step."""

    final_loss: float
    final_loss_diff_vs_continuous: float
    max_weight_diff_vs_continuous: float
    max_m_diff_vs_continuous: float
    max_v_diff_vs_continuous: float
    bin_identical_to_continuous: bool
    bin_sha256: str
    next_lr: float

    def line(self, final_step: int) -> str:
        return (
            f"loss of step {final_step} {self.final_loss!r} (diff {_fmt(self.final_loss_diff_vs_continuous)}), "
            f"max |diff| weights {_fmt(self.max_weight_diff_vs_continuous)} m {_fmt(self.max_m_diff_vs_continuous)} "
            f"v {_fmt(self.max_v_diff_vs_continuous)}, "
            f".bin {'identical' if self.bin_identical_to_continuous else 'differs'}, next lr {self.next_lr!r}"
        )


class VerificationReport(_Record):
    """``verification.json``: the verdict and every figure behind it."""

    format: Literal["andrea-resume-verification/1"] = REPORT_FORMAT
    problem: str
    completed: bool
    error: str | None = None
    all_checks_passed: bool = False
    positive: bool = Field(
        default=False, description="The stop path and the full resume reproduce the continuous run."
    )
    negative_divergence_detected: bool = Field(
        default=False, description="The no-RNG resume diverges, with a usable output."
    )
    tolerance: Tolerance
    sabotage: str | None
    stop_step: int | None = Field(
        description="The step the stop path stopped at; None if it never did."
    )
    final_step: int
    paths: list[PathRecord] = []
    checks: list[Check] = []
    stop_path: list[Comparison] = Field(
        default=[], description="Steps up to the stop, stop path vs continuous."
    )
    full_resume: list[Comparison] = Field(default=[], description="Full resume vs continuous.")
    no_rng_resume: list[Comparison] = Field(default=[], description="No-RNG resume vs continuous.")
    no_cursor_resume: list[Comparison] = Field(
        default=[], description="Resume without the data cursors vs continuous (trainer problem)."
    )
    figures: dict[str, PathFigures | TrainerFigures] = {}
    seconds: float = 0.0


# --- generic engine -----------------------------------------------------------------------------------


def run_path(
    name: str,
    argv: Sequence[str],
    output_dir: Path,
    log_dir: Path,
    index: int,
    total: int,
    stop_on: str | None = None,
    ok_codes: tuple[int, ...] = (0,),
) -> PathRecord:
    """Run one path as a fresh process, its output in ``log_dir/NAME.log``; raise if it fails.

    With ``stop_on`` (a regular expression), a real SIGTERM is sent to the process as soon as a line of
    its output matches: how an operator stops a long-running daemon. Whether it was sent is recorded in
    ``signal_sent``; a process that ends before the line appears is not signalled.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"{name}.log"
    program = "python" if argv[0] == sys.executable else Path(argv[0]).name
    print(f"[{index}/{total}] {name:<16} {program} {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    deadline = started + PATH_TIMEOUT_S
    pattern = re.compile(stop_on.encode()) if stop_on else None
    matched = threading.Event()
    signal_sent = None
    with open(log_file, "xb") as log_handle:
        process = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                log_handle.write(line)
                if pattern is not None and not matched.is_set() and pattern.search(line):
                    matched.set()

        reader = threading.Thread(target=pump, name=f"log-{name}", daemon=True)
        reader.start()
        try:
            if pattern is not None:
                while (
                    not matched.wait(0.02)
                    and process.poll() is None
                    and time.monotonic() < deadline
                ):
                    pass
                # Only this thread reaps the child, so a None poll() means the pid is still ours.
                if matched.is_set() and process.poll() is None:
                    os.kill(process.pid, signal.SIGTERM)
                    signal_sent = f"SIGTERM after the output line matching {stop_on!r}"
            returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            process.kill()
            process.wait()
            raise VerificationIncomplete(
                f"path {name} did not finish within {PATH_TIMEOUT_S} s (log: {log_file})"
            ) from exc
        finally:
            reader.join()
    seconds = time.monotonic() - started
    if returncode not in ok_codes:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-10:])
        raise VerificationIncomplete(
            f"path {name} exited with {returncode} (log: {log_file}):\n{tail}"
        )
    print(
        f"      {name:<16} ok ({seconds:.1f} s){'  [' + signal_sent + ']' if signal_sent else ''}",
        flush=True,
    )
    return PathRecord(
        name=name,
        command=list(argv),
        output_dir=str(output_dir),
        exit_code=returncode,
        seconds=round(seconds, 3),
        log_file=str(log_file),
        signal_sent=signal_sent,
    )


def _negatives(report: VerificationReport) -> list[tuple[str, list[Comparison]]]:
    """The negative controls this report ran, with their table labels."""
    sections = [("no-RNG", report.no_rng_resume), ("no-cursor", report.no_cursor_resume)]
    return [(label, comparisons) for label, comparisons in sections if comparisons]


def verdict(report: VerificationReport) -> VerificationReport:
    """Fill in positive / negative / all_checks_passed from the comparisons and checks."""
    positive_paths = {CONTINUOUS, STOP, FULL_RESUME}
    positive = (
        bool(report.full_resume)
        and all(c.passed for c in report.stop_path + report.full_resume)
        and all(c.passed for c in report.checks if c.path in positive_paths)
    )
    # Every negative control that ran must diverge, each with a usable output.
    negative = (
        bool(report.no_rng_resume)
        and all(
            all(c.sound for c in comparisons) and any(c.diverged for c in comparisons)
            for _, comparisons in _negatives(report)
        )
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


def _verify(
    output: Path,
    report: VerificationReport,
    sabotages: Sequence[str],
    body: Callable[[VerificationReport], None],
) -> int:
    """Refuse an existing output or an unknown sabotage, run ``body`` (which fills in the report) and
    finish: what every problem shares around its own paths and comparisons."""
    if output.exists() or output.is_symlink():
        print(
            f"refused: {output} already exists; choose a new directory (earlier evidence is never overwritten)",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    if report.sabotage is not None and report.sabotage not in sabotages:
        print(
            f"unknown sabotage {report.sabotage!r} for the {report.problem} problem; known: {', '.join(sabotages)}",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    output.mkdir(parents=True)
    started = time.monotonic()
    try:
        body(report)
        report.completed = True
    except VerificationIncomplete as exc:
        report.error = str(exc)
    report.seconds = round(time.monotonic() - started, 3)
    return finish(verdict(report), output)


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
            print(
                f"{c.name:<{width}}  {_fmt(c.max_abs_diff):>12}  {'yes' if c.passed else 'NO ' + _problems(c)}"
            )
        print()
    negatives = [
        (label, {c.name: c for c in comparisons}) for label, comparisons in _negatives(report)
    ]
    if report.full_resume:
        print(
            f"{'quantity':<{width}}  {'full resume':>12}  {'match':<5}"
            + "".join(f"  {label:>12}  {'differs':<7}" for label, _ in negatives)
        )
        for c in report.full_resume:
            row = f"{c.name:<{width}}  {_fmt(c.max_abs_diff):>12}  {'yes' if c.passed else 'NO':<5}"
            for _, by_name in negatives:
                n = by_name.get(c.name)
                differs = (
                    "-"
                    if n is None
                    else (
                        "yes" if n.diverged else ("no" if n.passed else "UNUSABLE " + _problems(n))
                    )
                )
                row += f"  {'-' if n is None else _fmt(n.max_abs_diff):>12}  {differs:<7}"
            print(row.rstrip())
        print()
    for name, f in report.figures.items():
        print(f"{name:<16} {f.line(report.final_step)}")
    failed = [c for c in report.checks if not c.passed]
    print(f"protocol checks: {len(report.checks) - len(failed)}/{len(report.checks)} passed")
    for c in failed:
        print(f"  FAILED {c.path}: {c.name}: {c.detail}")
    within = (
        "bit for bit" if report.tolerance.absolute == 0 else f"within {report.tolerance.absolute:g}"
    )
    print(
        f"positive (full resume matches {within}): {'yes' if report.positive else 'NO'}; "
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


def _mini_command(
    steps: int, output_dir: Path, resume: Path | None = None, *extra: str
) -> list[str]:
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
        raise VerificationIncomplete(
            f"{path_dir / mini.SUMMARY_NAME}: not a mini summary: {exc}"
        ) from exc
    checkpoint = path_dir / summary.checkpoint.file
    fingerprint = path_dir / (summary.checkpoint.file + ".sha256")
    if not (checkpoint.is_file() and fingerprint.is_file()):
        raise VerificationIncomplete(
            f"{checkpoint}: missing, or its fingerprint {fingerprint.name} is"
        )
    actual = _sha256_file(checkpoint)
    if (
        actual != summary.checkpoint.sha256
        or f"{actual}  {checkpoint.name}"
        not in fingerprint.read_text(errors="replace").splitlines()
    ):
        raise VerificationIncomplete(
            f"{checkpoint}: sha256 {actual} does not match its summary and fingerprint file"
        )
    return raw


def _reused_report(reuse: Path, problem: str) -> VerificationReport:
    """An earlier verification whose reference paths may be reused: passed, unsabotaged, same problem."""
    report_path = reuse / REPORT_NAME
    try:
        earlier = VerificationReport.model_validate(_load_json(report_path))
    except ValidationError as exc:
        raise VerificationIncomplete(f"{report_path}: not a verification report: {exc}") from exc
    if earlier.problem != problem or earlier.sabotage is not None or not earlier.all_checks_passed:
        raise VerificationIncomplete(
            f"{report_path}: only a passed, unsabotaged {problem} verification can be reused"
        )
    return earlier


def _mini_paths(
    output: Path, sabotage: str | None, reuse: Path | None
) -> tuple[list[PathRecord], dict[str, dict[str, Any]]]:
    logs = output / "logs"
    records: list[PathRecord] = []
    if reuse is None:
        source = output
        records.append(
            run_path(
                CONTINUOUS,
                _mini_command(MINI_TOTAL_STEPS, output / CONTINUOUS),
                output / CONTINUOUS,
                logs,
                1,
                4,
            )
        )
        records.append(
            run_path(STOP, _mini_command(MINI_STOP_STEP, output / STOP), output / STOP, logs, 2, 4)
        )
    else:
        source = reuse
        earlier = {record.name: record for record in _reused_report(reuse, "mini").paths}
        for name in (CONTINUOUS, STOP, NO_RNG_RESUME):
            print(f"[-/4] {name:<16} reused from {reuse / name}", flush=True)
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
        command = _mini_command(
            resume_steps, output / NO_RNG_RESUME, stop_checkpoint, "--omit-rng-restore"
        )
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
    return {
        key: summary.get(key) for key in ("config", "code_version", "data_identity", "versions")
    }


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
            "next draws: NumPy PCG64": (
                continuous["next_draws"]["numpy_pcg64"],
                resumed["next_draws"]["numpy_pcg64"],
            ),
            "next draws: torch CPU": (
                continuous["next_draws"]["torch_cpu"],
                resumed["next_draws"]["torch_cpu"],
            ),
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
        check(
            path,
            "progress (step, epoch, cursor)",
            actual == expected,
            f"{actual}, expected {expected}",
        )

    def rows_once_per_epoch(path: str) -> None:
        history = summaries[path]["history"]
        by_epoch: dict[int, list[int]] = {}
        for record in history:
            by_epoch.setdefault(record["epoch"], []).extend(record["row_ids"])
        repeated = {
            epoch: len(rows) - len(set(rows))
            for epoch, rows in by_epoch.items()
            if len(rows) != len(set(rows))
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
            "random generators restored"
            if rng_restored
            else "random generators deliberately not restored",
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
        weights = next(
            (c.max_abs_diff for c in comparisons.get(path, []) if c.name == "final parameters"), 0.0
        )
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

    def body(report: VerificationReport) -> None:
        paths, summaries = _mini_paths(output, sabotage, reuse)
        report.paths = paths
        stop_sha256 = summaries[STOP]["checkpoint"]["sha256"]
        stop_label = f"steps 1-{MINI_STOP_STEP}"
        report.stop_path = compare_all(
            _per_step_quantities(
                summaries[CONTINUOUS]["history"][:MINI_STOP_STEP],
                summaries[STOP]["history"],
                stop_label,
            ),
            MINI_ATOL,
        )
        report.full_resume = compare_all(
            _mini_resume_quantities(summaries[CONTINUOUS], summaries[STOP], summaries[FULL_RESUME]),
            MINI_ATOL,
        )
        report.no_rng_resume = compare_all(
            _mini_resume_quantities(
                summaries[CONTINUOUS], summaries[STOP], summaries[NO_RNG_RESUME]
            ),
            MINI_ATOL,
        )
        report.checks = _mini_checks(summaries, stop_sha256)
        report.figures = {
            **_mini_figures(
                summaries, {FULL_RESUME: report.full_resume, NO_RNG_RESUME: report.no_rng_resume}
            )
        }

    report = VerificationReport(
        problem="mini",
        completed=False,
        tolerance=Tolerance(absolute=MINI_ATOL),
        sabotage=sabotage,
        stop_step=MINI_STOP_STEP,
        final_step=MINI_TOTAL_STEPS,
    )
    return _verify(output, report, mini.SABOTAGES, body)


# --- the real trainer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TrainerRun:
    """What one trainer path left behind, read back and verified."""

    run_dir: Path
    entries: list[LossEntry]
    curve: list[LossEntry]  # the canonical curve: newest entry per step
    manifest: Manifest  # of the newest checkpoint
    weights: np.ndarray
    m: np.ndarray
    v: np.ndarray
    log: str


class TrainerLaunch(BaseModel):
    """How the trainer problem starts ``andrea-trainer``: on which device (None: the config's, or
    cpu for the tiny preset), and in how many processes (more than one: through
    ``torchrun --standalone``, DDP)."""

    model_config = ConfigDict(frozen=True)
    device: Literal["cpu", "cuda"] | None = None
    nproc: int = Field(default=1, ge=1)

    def prefix(self) -> list[str]:
        if self.nproc == 1:
            return [sys.executable, "-B", "-m", "andrea.daemon.trainer_cli"]
        bin_dir = Path(sys.executable).parent
        return [
            str(bin_dir / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            str(self.nproc),
            "--max-restarts",
            "0",
            "--no-python",
            str(bin_dir / "andrea-trainer"),
        ]

    @property
    def stop_codes(self) -> tuple[int, ...]:
        # torchrun re-raises the SIGTERM it forwarded to its workers: it exits 1 even when every
        # worker checkpointed and exited 0 (docs/distributed.md). The checkpoint is checked after.
        return (0,) if self.nproc == 1 else (0, 1)


def _trainer_command(
    run_dir: Path,
    cache_dir: Path | None,
    *extra: str,
    config: Path | None = None,
    launch: TrainerLaunch | None = None,
) -> list[str]:
    launch = launch or TrainerLaunch()
    # The user's configuration decides preset, data, device, precision and threads; the schedule of
    # the proof (steps, cadence, the fixed mixture, no samples) is the protocol's.
    setup = (
        ["--config", str(config)]
        if config is not None
        else ["--preset", "andrea-tiny", "--device", launch.device or "cpu", "--threads", "1"]
    )
    if config is not None and launch.device is not None:
        setup += ["--device", launch.device]
    argv = [
        *launch.prefix(),
        "--run-dir",
        str(run_dir),
        *setup,
        "--mixing",
        "fixed",
        "--max-steps",
        str(TRAINER_TOTAL_STEPS),
        "--checkpoint-every",
        str(TRAINER_CHECKPOINT_EVERY),
        "--log-every",
        "1",
        "--sample-every",
        "0",
    ]
    if cache_dir is not None:
        argv += ["--cache-dir", str(cache_dir)]
    return argv + list(extra)


def _verified(run_dir: Path, step: int) -> tuple[Manifest, fmt.Payload]:
    try:
        return verify_checkpoint(run_dir, step)
    except ValueError as exc:
        raise VerificationIncomplete(
            f"{run_dir / bin_name(step)}: not an intact checkpoint: {exc}"
        ) from exc


def _load_trainer_run(run_dir: Path, record: PathRecord) -> _TrainerRun:
    if record.log_file is None:
        raise VerificationIncomplete(f"path {record.name} has no log")
    steps = checkpoint_steps(run_dir) if run_dir.is_dir() else []
    if not steps:
        raise VerificationIncomplete(f"{run_dir}: no checkpoint")
    manifest, payload = _verified(run_dir, steps[0])
    try:
        entries = read_entries(run_dir / LOSS_FILE)
    except (OSError, LossLogError) as exc:
        raise VerificationIncomplete(f"{run_dir / LOSS_FILE}: unreadable: {exc}") from exc
    if not entries:
        raise VerificationIncomplete(f"{run_dir / LOSS_FILE}: no entries")
    try:
        log = Path(record.log_file).read_text(errors="replace")
    except OSError as exc:
        raise VerificationIncomplete(f"{record.log_file}: unreadable: {exc}") from exc
    return _TrainerRun(
        run_dir,
        entries,
        canonical_curve(entries),
        manifest,
        payload.weights,
        payload.m,
        payload.v,
        log,
    )


def _special_files(directory: str, names: list[str]) -> list[str]:
    # A control socket left by the stopped trainer is process state, not run state, and cannot be copied.
    paths = (os.path.join(directory, name) for name in names)
    return [
        name
        for name, path in zip(names, paths)
        if not (os.path.isfile(path) or os.path.isdir(path))
    ]


def _copy_stop(stop_dir: Path, target: Path, stop: Manifest) -> None:
    """A resume starts from a copy, so that the stop path's evidence stays exactly as it was left."""
    shutil.copytree(stop_dir, target, ignore=_special_files)
    copied, _ = _verified(target, stop.step)
    if copied.bin_sha256 != stop.bin_sha256:
        raise VerificationIncomplete(
            f"{target}: the copied stop checkpoint differs from {stop_dir}"
        )


def _trainer_stop_step(stop_dir: Path, record: PathRecord) -> int:
    """The step the stop path stopped at, if the stop can serve the protocol at all."""
    if record.signal_sent is None:
        raise VerificationIncomplete(
            f"the stop path ended before step {TRAINER_SIGNAL_AFTER} was logged, so it was never signalled"
        )
    steps = checkpoint_steps(stop_dir)
    if not steps:
        raise VerificationIncomplete(f"{stop_dir}: the stop path left no checkpoint")
    step = steps[0]
    # Too late a signal is a matter of machine load, not of the resume: the protocol could not be run.
    if step % TRAINER_CHECKPOINT_EVERY == 0 or step >= TRAINER_TOTAL_STEPS:
        raise VerificationIncomplete(
            f"the stop path stopped at step {step}, a cadence point or the end (SIGTERM was sent after step "
            f"{TRAINER_SIGNAL_AFTER}; the machine was too slow to deliver it in time); run the verification again"
        )
    return step


def user_config(output: Path, source: Path, base: Path) -> Path:
    """The user's run config made usable from the verification's own run directories: relative
    data paths resolved against ``base`` (where the trainer would resolve them), and ``[metrics]``
    dropped (the proof writes no TensorBoard or Prometheus files). Written to OUTPUT/user-config.toml;
    raises ConfigError for a file that is not a valid run config."""
    import tomli_w

    values = check_user_config(source)
    values.pop("metrics", None)
    for arm in values.get("data", {}).get("arms", []):
        if "paths" in arm:
            arm["paths"] = [p if Path(p).is_absolute() else str(base / p) for p in arm["paths"]]
        if arm.get("path") and not Path(arm["path"]).is_absolute():
            arm["path"] = str(base / arm["path"])
    target = output / "user-config.toml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(tomli_w.dumps(values), encoding="utf-8")
    return target


def check_user_config(source: Path) -> dict[str, Any]:
    """The values of a run config file, validated as the trainer validates them (ConfigError)."""
    from andrea.daemon.config import build_config, load_toml

    values = load_toml(source)
    build_config(values, source=str(source))
    return values


def _trainer_paths(
    output: Path,
    sabotage: str | None,
    reuse: Path | None,
    cache_dir: Path | None,
    config: Path | None = None,
    launch: TrainerLaunch | None = None,
) -> tuple[list[PathRecord], dict[str, _TrainerRun], int]:
    launch = launch or TrainerLaunch()
    logs = output / "logs"
    records: dict[str, PathRecord] = {}
    if reuse is None:
        source = output
        records[CONTINUOUS] = run_path(
            CONTINUOUS,
            _trainer_command(output / CONTINUOUS, cache_dir, config=config, launch=launch),
            output / CONTINUOUS,
            logs,
            1,
            5,
        )
        records[STOP] = run_path(
            STOP,
            _trainer_command(output / STOP, cache_dir, config=config, launch=launch),
            output / STOP,
            logs,
            2,
            5,
            stop_on=rf"step {TRAINER_SIGNAL_AFTER}/{TRAINER_TOTAL_STEPS} ",
            ok_codes=launch.stop_codes,
        )
        stop_step = _trainer_stop_step(output / STOP, records[STOP])
    else:
        source = reuse
        earlier = _reused_report(reuse, "trainer")
        if earlier.stop_step is None:
            raise VerificationIncomplete(f"{reuse / REPORT_NAME}: records no stop step")
        stop_step = earlier.stop_step
        earlier_paths = {record.name: record for record in earlier.paths}
        for name in (CONTINUOUS, STOP, *TRAINER_NEGATIVES):
            print(f"[-/5] {name:<16} reused from {reuse / name}", flush=True)
            records[name] = earlier_paths[name].model_copy(
                update={"reused_from": str(reuse / name)}
            )
    stop_manifest, _ = _verified(source / STOP, stop_step)
    resumes = {FULL_RESUME: TRAINER_SABOTAGES.get(sabotage or "")}
    if reuse is None:
        resumes.update(TRAINER_NEGATIVES)
    for index, (name, skipped) in enumerate(resumes.items(), start=3):
        _copy_stop(source / STOP, output / name, stop_manifest)
        extra = ["--unsafe-skip-restore", skipped] if skipped else []
        command = _trainer_command(output / name, cache_dir, *extra, config=config, launch=launch)
        records[name] = run_path(name, command, output / name, logs, index, 5)
    runs = {
        name: _load_trainer_run((output if name in resumes else source) / name, record)
        for name, record in records.items()
    }
    order = (CONTINUOUS, STOP, FULL_RESUME, *TRAINER_NEGATIVES)
    return [records[name] for name in order], runs, stop_step


def _between(curve: list[LossEntry], first: int, last: int) -> list[LossEntry]:
    return [entry for entry in curve if first <= entry.step <= last]


def _trainer_step_quantities(
    reference: list[LossEntry], candidate: list[LossEntry], label: str
) -> dict[str, tuple[Any, Any]]:
    return {
        f"step numbers ({label})": ([e.step for e in reference], [e.step for e in candidate]),
        f"batches: arm, tokens, sha256 ({label})": (
            [[e.arm, e.tokens, e.batch_sha256] for e in reference],
            [[e.arm, e.tokens, e.batch_sha256] for e in candidate],
        ),
        f"learning rates ({label})": ([e.lr for e in reference], [e.lr for e in candidate]),
        f"losses ({label})": ([e.loss for e in reference], [e.loss for e in candidate]),
    }


def compare_arrays(
    name: str, layout: Sequence[LayoutEntry], groups: Sequence[tuple[str, np.ndarray, np.ndarray]]
) -> Comparison:
    """Compare flat float32 payload arrays bit for bit, with :mod:`compare`'s rules and report.

    ``groups`` are ``(label, reference, candidate)``, each array flattened in ``layout`` order, so that an
    issue names its tensor and index (``$.m.blocks.0.attn.c_attn.weight[3][7]``). Vectorised: a payload
    has 137k numbers per array even for the tiny preset, too many for the generic recursive walk.
    """
    counts: dict[IssueKind, int] = {}
    issues: list[Issue] = []
    leaves = numbers = 0
    max_abs_diff = 0.0
    offsets = np.array([entry.offset for entry in layout], dtype=np.int64)

    def where(label: str, flat_index: int) -> str:
        entry = layout[int(np.searchsorted(offsets, flat_index, side="right")) - 1]
        index = np.unravel_index(flat_index - entry.offset, tuple(entry.shape))
        return f"$.{label}.{entry.name}" + "".join(f"[{int(i)}]" for i in index)

    def report(
        kind: IssueKind, found: np.ndarray, label: str, left: np.ndarray, right: np.ndarray
    ) -> None:
        counts[kind] = counts.get(kind, 0) + int(found.size)
        for i in found[: max(0, MAX_ISSUES_KEPT - (counts[kind] - int(found.size)))]:
            a, b = float(left[i]), float(right[i])
            diff = abs(a - b) if kind is IssueKind.VALUE_MISMATCH else None
            issues.append(
                Issue(
                    kind=kind, path=where(label, int(i)), left=repr(a), right=repr(b), abs_diff=diff
                )
            )

    for label, left, right in groups:
        if left.shape != right.shape:
            counts[IssueKind.LENGTH_MISMATCH] = counts.get(IssueKind.LENGTH_MISMATCH, 0) + 1
            issues.append(
                Issue(
                    kind=IssueKind.LENGTH_MISMATCH,
                    path=f"$.{label}",
                    left=f"length {left.size}",
                    right=f"length {right.size}",
                )
            )
            continue
        leaves += left.size
        finite = np.isfinite(left) & np.isfinite(right)
        numbers += int(finite.sum())
        # Bit patterns, not ==: -0.0 against 0.0 is a difference here, as in compare().
        differ = finite & (left.view(np.uint32) != right.view(np.uint32))
        diff = np.abs(left.astype(np.float64) - right.astype(np.float64))
        max_abs_diff = max(max_abs_diff, float(diff[finite].max(initial=0.0)))
        report(IssueKind.NON_FINITE, np.flatnonzero(~finite), label, left, right)
        report(IssueKind.VALUE_MISMATCH, np.flatnonzero(differ), label, left, right)
    return Comparison(
        name=name,
        atol=TRAINER_ATOL,
        leaves_compared=leaves,
        numbers_compared=numbers,
        max_abs_diff=max_abs_diff,
        counts={kind: n for kind, n in counts.items() if n},
        issues=issues,
    )


def _trainer_identity(manifest: Manifest) -> dict[str, Any]:
    dump = manifest.model_dump(mode="json")
    return {
        key: dump[key]
        for key in ("model", "layout", "config_hash", "config", "mixing", "environment")
    } | {"data identities": [[c.name, c.identity, c.n_tokens, c.n_chunks] for c in manifest.data]}


def _trainer_resume_comparisons(
    continuous: _TrainerRun, stop: _TrainerRun, resumed: _TrainerRun, stop_step: int
) -> list[Comparison]:
    ref, new = continuous.manifest, resumed.manifest
    comparisons = compare_all(
        _trainer_step_quantities(
            _between(continuous.curve, stop_step + 1, TRAINER_TOTAL_STEPS),
            _between(resumed.curve, stop_step + 1, TRAINER_TOTAL_STEPS),
            f"steps {stop_step + 1}-{TRAINER_TOTAL_STEPS}",
        )
        | {
            f"loss history carried over (steps 1-{stop_step})": (
                [e.model_dump() for e in stop.curve],
                [e.model_dump() for e in _between(resumed.curve, 1, stop_step)],
            )
        },
        TRAINER_ATOL,
    )
    for step in range(TRAINER_CHECKPOINT_EVERY, TRAINER_TOTAL_STEPS, TRAINER_CHECKPOINT_EVERY):
        if step > stop_step:
            (_, a), (_, b) = _verified(continuous.run_dir, step), _verified(resumed.run_dir, step)
            comparisons.append(
                compare_arrays(
                    f"checkpoint of step {step} (cadence): weights, m, v",
                    ref.layout,
                    [("weights", a.weights, b.weights), ("m", a.m, b.m), ("v", a.v, b.v)],
                )
            )
    comparisons += [
        compare_arrays(
            "final weights", ref.layout, [("weights", continuous.weights, resumed.weights)]
        ),
        compare_arrays("final Adam m", ref.layout, [("m", continuous.m, resumed.m)]),
        compare_arrays("final Adam v", ref.layout, [("v", continuous.v, resumed.v)]),
    ]
    comparisons += compare_all(
        {
            "final .bin bytes (step, n_params, sha256)": (
                [ref.step, ref.n_params, ref.bin_sha256],
                [new.step, new.n_params, new.bin_sha256],
            ),
            "data cursors (epoch, position per arm)": (
                [c.model_dump(mode="json") for c in ref.data],
                [c.model_dump(mode="json") for c in new.data],
            ),
            "scheduler (last and next lr)": (
                ref.scheduler.model_dump(mode="json"),
                new.scheduler.model_dump(mode="json"),
            ),
            "optimizer (AdamW step count, hyper-parameters)": (
                ref.optimizer.model_dump(mode="json"),
                new.optimizer.model_dump(mode="json"),
            ),
            "progress (step, tokens seen)": (
                [ref.progress.step, ref.progress.tokens_seen],
                [new.progress.step, new.progress.tokens_seen],
            ),
            "random generator states after the last step": (
                ref.rng.model_dump(mode="json"),
                new.rng.model_dump(mode="json"),
            ),
            "model, layout, config, data identity, environment": (
                _trainer_identity(ref),
                _trainer_identity(new),
            ),
        },
        TRAINER_ATOL,
    )
    return comparisons


def _cursors(manifest: Manifest) -> str:
    return ", ".join(f"{c.name} {c.epoch}:{c.position}/{c.n_chunks}" for c in manifest.data)


def _trainer_checks(
    runs: dict[str, _TrainerRun], records: list[PathRecord], stop_step: int
) -> list[Check]:
    checks: list[Check] = []
    last = TRAINER_TOTAL_STEPS

    def check(path: str, name: str, passed: bool, detail: str) -> None:
        checks.append(Check(path=path, name=name, passed=passed, detail=detail))

    def steps_of(path: str, segment: int) -> list[int]:
        return [e.step for e in runs[path].entries if e.segment == segment]

    def steps_detail(steps: list[int]) -> str:
        return f"{len(steps)} entries, steps {steps[:1]}..{steps[-1:]}"

    continuous = runs[CONTINUOUS]
    check(
        CONTINUOUS,
        f"one process life trained steps 1-{last}, each once, and checkpointed the end",
        steps_of(CONTINUOUS, 1) == list(range(1, last + 1))
        and len(continuous.entries) == last
        and (continuous.manifest.step, continuous.manifest.trigger) == (last, "end"),
        f"{steps_detail(steps_of(CONTINUOUS, 1))}; final checkpoint step {continuous.manifest.step}, "
        f"trigger {continuous.manifest.trigger}",
    )
    stop = runs[STOP]
    signal_sent = next(r.signal_sent for r in records if r.name == STOP)
    check(
        STOP,
        "stopped by a real SIGTERM between cadence points, checkpointing the step it finished",
        (stop.manifest.step, stop.manifest.trigger) == (stop_step, "sigterm")
        and steps_of(STOP, 1) == list(range(1, stop_step + 1))
        and len(stop.entries) == stop_step,
        f"step {stop.manifest.step}, trigger {stop.manifest.trigger} ({signal_sent}); cadence every "
        f"{TRAINER_CHECKPOINT_EVERY}; loss log: {steps_detail(steps_of(STOP, 1))}",
    )
    check(
        STOP,
        "stops mid-epoch (some arm's cursor is inside its order)",
        any(0 < c.position < c.n_chunks for c in stop.manifest.data),
        f"cursors (epoch:position/chunks): {_cursors(stop.manifest)}",
    )
    resumes = [(FULL_RESUME, None)] + list(TRAINER_NEGATIVES.items())
    for path, skipped in resumes:
        run = runs[path]
        check(
            path,
            f"resumed from the stop checkpoint, trained exactly steps {stop_step + 1}-{last} in a second life",
            f"resumed from {bin_name(stop_step)}" in run.log
            and steps_of(path, 1) == list(range(1, stop_step + 1))
            and steps_of(path, 2) == list(range(stop_step + 1, last + 1))
            and len(run.entries) == last
            and run.manifest.step == last,
            f"segment 1: {steps_detail(steps_of(path, 1))}; segment 2: {steps_detail(steps_of(path, 2))}; "
            f"final checkpoint step {run.manifest.step}",
        )
        unsafe = re.search(r"UNSAFE: skipping restore of (\S+)", run.log)
        if skipped is None:
            check(
                path,
                "complete restore",
                unsafe is None,
                unsafe.group(0) if unsafe else "nothing skipped",
            )
        else:
            check(
                path,
                f"restore of {skipped} deliberately skipped",
                unsafe is not None and unsafe.group(1) == skipped,
                unsafe.group(0) if unsafe else "the trainer did not announce the skipped restore",
            )
    return checks


def _trainer_figures(
    runs: dict[str, _TrainerRun], comparisons: dict[str, list[Comparison]]
) -> dict[str, PathFigures | TrainerFigures]:
    reference = runs[CONTINUOUS]
    figures: dict[str, PathFigures | TrainerFigures] = {}
    for path in (CONTINUOUS, FULL_RESUME, *TRAINER_NEGATIVES):
        run = runs[path]
        diffs = {c.name: c.max_abs_diff for c in comparisons.get(path, [])}
        figures[path] = TrainerFigures(
            final_loss=run.curve[-1].loss,
            final_loss_diff_vs_continuous=abs(run.curve[-1].loss - reference.curve[-1].loss),
            max_weight_diff_vs_continuous=diffs.get("final weights", 0.0),
            max_m_diff_vs_continuous=diffs.get("final Adam m", 0.0),
            max_v_diff_vs_continuous=diffs.get("final Adam v", 0.0),
            bin_identical_to_continuous=run.manifest.bin_sha256 == reference.manifest.bin_sha256,
            bin_sha256=run.manifest.bin_sha256,
            next_lr=run.manifest.scheduler.next_lr,
        )
    return figures


def run_trainer(
    output: Path,
    sabotage: str | None = None,
    reuse: Path | None = None,
    cache_dir: Path | None = None,
    config: tuple[Path, Path] | None = None,
    launch: TrainerLaunch | None = None,
) -> int:
    """Verify the real trainer's resume into the new directory ``output``; returns the exit code.

    Five fresh ``andrea-trainer`` processes (tiny preset, CPU, one thread, fixed mixture): continuous,
    stop (a real SIGTERM mid-run), full resume, and two negative controls that skip restoring the RNGs
    or the data cursors. Everything is compared bit for bit. ``sabotage`` (a key of
    :data:`TRAINER_SABOTAGES`) makes the full resume skip a restore, so the verification must fail;
    ``reuse`` takes every path but the full resume from an earlier passed verification. ``cache_dir`` is
    the trainer's tokenized-corpus cache. ``config`` = (run config file, directory its relative data
    paths are relative to; see :func:`user_config`) replaces the tiny preset, CPU and one thread with
    the user's own configuration: preset, data, device, precision.
    """

    def body(report: VerificationReport) -> None:
        prepared = user_config(output, *config) if config is not None else None
        paths, runs, stop_step = _trainer_paths(
            output, sabotage, reuse, cache_dir, prepared, launch
        )
        report.paths = paths
        report.stop_step = stop_step
        report.stop_path = compare_all(
            _trainer_step_quantities(
                _between(runs[CONTINUOUS].curve, 1, stop_step),
                runs[STOP].curve,
                f"steps 1-{stop_step}",
            ),
            TRAINER_ATOL,
        )
        resumed = {
            path: _trainer_resume_comparisons(runs[CONTINUOUS], runs[STOP], runs[path], stop_step)
            for path in (FULL_RESUME, *TRAINER_NEGATIVES)
        }
        report.full_resume = resumed[FULL_RESUME]
        report.no_rng_resume = resumed[NO_RNG_RESUME]
        report.no_cursor_resume = resumed[NO_CURSOR_RESUME]
        report.checks = _trainer_checks(runs, paths, stop_step)
        report.figures = _trainer_figures(runs, resumed)

    report = VerificationReport(
        problem="trainer",
        completed=False,
        tolerance=Tolerance(absolute=TRAINER_ATOL),
        sabotage=sabotage,
        stop_step=None,
        final_step=TRAINER_TOTAL_STEPS,
    )
    return _verify(output, report, list(TRAINER_SABOTAGES), body)


class ProblemOptions(BaseModel):
    """What a verification run may be given besides its output directory."""

    sabotage: str | None = None
    reuse: Path | None = None
    cache_dir: Path | None = Field(
        default=None, description="The trainer's corpus cache (trainer problem only)."
    )
    config: tuple[Path, Path] | None = Field(
        default=None,
        description="The user's run config and the base of its relative paths (trainer problem only).",
    )
    launch: TrainerLaunch = Field(
        default_factory=TrainerLaunch,
        description="Device and process count (trainer problem only).",
    )


#: Problem name → runner. A runner takes (output, options) and returns the exit code.
PROBLEMS: dict[str, Callable[[Path, ProblemOptions], int]] = {
    "mini": lambda output, options: run_mini(output, options.sabotage, options.reuse),
    "trainer": lambda output, options: run_trainer(
        output, options.sabotage, options.reuse, options.cache_dir, options.config, options.launch
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m andrea.control.verify_resume", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    parser.add_argument(
        "--run-dir", type=Path, help="trainer problem: verify on this run's run.toml (see --config)"
    )
    args = parser.parse_args(argv)
    return run_problem(parser, args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The verifier's options, shared with ``andreactl verify-resume``."""
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="new directory for the paths and verification.json",
    )
    parser.add_argument("--problem", choices=sorted(PROBLEMS), default="mini")
    parser.add_argument(
        "--sabotage",
        help="break the full resume on purpose, so the verification must fail (mini: "
        + ", ".join(mini.SABOTAGES)
        + "; trainer: "
        + ", ".join(TRAINER_SABOTAGES)
        + ")",
    )
    parser.add_argument(
        "--reuse", type=Path, help="earlier passed verification whose reference paths are reused"
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="the trainer's tokenized-corpus cache (trainer problem)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="trainer problem: prove the resume on this run config (its preset, data, device) "
        "instead of the tiny preset",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), help="trainer problem: the device (default cpu)"
    )
    parser.add_argument(
        "--nproc",
        type=int,
        help="trainer problem: processes, through torchrun --standalone (DDP) when more than 1",
    )


def run_problem(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the verification that ``args`` (parsed by :func:`add_arguments`) describe; returns the exit code."""
    for name in ("cache_dir", "device", "nproc"):
        if getattr(args, name, None) is not None and args.problem != "trainer":
            parser.error(f"--{name.replace('_', '-')} applies to the trainer problem only")
    nproc = getattr(args, "nproc", None)
    if nproc is not None and nproc < 1:
        parser.error("--nproc must be at least 1")
    launch = TrainerLaunch(device=getattr(args, "device", None), nproc=nproc or 1)
    config: Path | None = getattr(args, "config", None)
    run_dir: Path | None = getattr(args, "run_dir", None)
    if (config is not None or run_dir is not None) and args.problem != "trainer":
        parser.error("--config and --run-dir apply to the trainer problem only")
    if config is not None and run_dir is not None:
        parser.error("give --config or --run-dir, not both")
    prepared = None
    if config is not None or run_dir is not None:
        from andrea.daemon.config import ConfigError
        from andrea.daemon.rundir import CONFIG_FILE

        source = config if config is not None else run_dir / CONFIG_FILE
        # Relative data paths mean what the trainer makes of them: relative to the run directory,
        # or, for a config file given alone, to the directory that holds it.
        base = (run_dir if run_dir is not None else source.parent).resolve()
        try:
            check_user_config(source)
            prepared = (source, base)
        except ConfigError as e:
            print(f"verify-resume: {e}", file=sys.stderr)
            return 2
    options = ProblemOptions(
        sabotage=args.sabotage,
        reuse=args.reuse,
        cache_dir=args.cache_dir,
        config=prepared,
        launch=launch,
    )
    return PROBLEMS[args.problem](args.output, options)


if __name__ == "__main__":
    sys.exit(main())
