"""The verification engine: runs paths as fresh processes, compares them, and writes the verdict.

A problem (:mod:`.mini`, :mod:`.trainer`) runs its paths with :func:`run_path`, compares them with
:mod:`andrea.control.compare`, and fills in a :class:`VerificationReport` inside :func:`_verify`, which
hands it to :func:`finish`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.control.compare import Comparison
from andrea.daemon.rundir.durable import atomic_write_bytes

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_INCOMPLETE = 2

REPORT_NAME = "verification.json"
REPORT_FORMAT: Literal["andrea-resume-verification/1"] = "andrea-resume-verification/1"

CONTINUOUS = "continuous"
STOP = "stop"
FULL_RESUME = "full_resume"
NO_RNG_RESUME = "no_rng_resume"
NO_CURSOR_RESUME = "no_cursor_resume"

#: A path takes a few seconds; this only stops a hung one.
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
    mixing: Literal["fixed", "proxy"] | None = Field(
        default=None,
        description="The trainer problem's mixing: fixed, or proxy (andrea-proxy in the loop); "
        "None for the mini problem, and in reports written before proxy proofs existed (fixed).",
    )
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
    returncode, signal_sent = _run_logged(name, argv, log_file, started + PATH_TIMEOUT_S, stop_on)
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


def _run_logged(
    name: str, argv: Sequence[str], log_file: Path, deadline: float, stop_on: str | None
) -> tuple[int, str | None]:
    """Run ``argv`` until it exits, its output into ``log_file``; returns its exit code and the
    signal it was sent (see :func:`run_path`), or raises if it outlives ``deadline``."""
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
    return returncode, signal_sent


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
    for check in failed:
        print(f"  FAILED {check.path}: {check.name}: {check.detail}")
    within = (
        "bit for bit" if report.tolerance.absolute == 0 else f"within {report.tolerance.absolute:g}"
    )
    print(
        f"positive (full resume matches {within}): {'yes' if report.positive else 'NO'}; "
        f"negative divergence detected: {'yes' if report.negative_divergence_detected else 'NO'}; "
        f"all checks passed: {'yes' if report.all_checks_passed else 'NO'}"
        + (f"  [sabotage: {report.sabotage}]" if report.sabotage else "")
        + ("  [mixing: proxy, andrea-proxy in the loop]" if report.mixing == "proxy" else "")
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
