"""The mini problem: the seed's exercise (:mod:`andrea.control.mini_problem`), tolerance 1e-12."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from andrea.control import mini_problem as mini
from andrea.control.compare import Comparison, compare_all
from andrea.control.verify_resume.engine import (
    CONTINUOUS,
    FULL_RESUME,
    NO_RNG_RESUME,
    STOP,
    Check,
    PathFigures,
    PathRecord,
    Tolerance,
    VerificationIncomplete,
    VerificationReport,
    _load_json,
    _reused_report,
    _sha256_file,
    _verify,
    run_path,
)

#: The seed's CPU protocol: absolute 1e-12, relative 0. Part of this exercise, not a rule for all models.
MINI_ATOL = 1e-12
MINI_TOTAL_STEPS = 10
MINI_STOP_STEP = 5


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
    stop_cursor = summaries[STOP]["progress"]["cursor"]
    crossed = {record["epoch"] for record in summaries[CONTINUOUS]["history"][MINI_STOP_STEP:]}
    checks = [
        _progress_check(summaries[CONTINUOUS], CONTINUOUS, MINI_TOTAL_STEPS, config),
        _rows_check(summaries[CONTINUOUS], CONTINUOUS),
        _progress_check(summaries[STOP], STOP, MINI_STOP_STEP, config),
        Check(
            path=STOP,
            name="stops mid-epoch",
            passed=0 < stop_cursor < config.n_rows,
            detail=f"cursor {stop_cursor} of {config.n_rows}",
        ),
        Check(
            path=CONTINUOUS,
            name="the resumed steps cross into a new data order",
            passed=len(crossed) > 1,
            detail=f"epochs of steps {MINI_STOP_STEP + 1}-{MINI_TOTAL_STEPS}: {sorted(crossed)}",
        ),
    ]
    for path, rng_restored in ((FULL_RESUME, True), (NO_RNG_RESUME, False)):
        checks += _resume_checks(summaries[path], path, rng_restored, stop_sha256, config)
    return checks


def _progress_check(
    summary: dict[str, Any], path: str, step: int, config: mini.MiniConfig
) -> Check:
    progress = summary["progress"]
    rows = step * config.batch_size
    # A new order is drawn when a batch needs it, so a finished epoch leaves the cursor at n_rows.
    epoch = (rows - 1) // config.n_rows
    expected = (step, epoch, rows - epoch * config.n_rows)
    actual = (progress["step"], progress["epoch"], progress["cursor"])
    return Check(
        path=path,
        name="progress (step, epoch, cursor)",
        passed=actual == expected,
        detail=f"{actual}, expected {expected}",
    )


def _rows_check(summary: dict[str, Any], path: str) -> Check:
    history = summary["history"]
    by_epoch: dict[int, list[int]] = {}
    for record in history:
        by_epoch.setdefault(record["epoch"], []).extend(record["row_ids"])
    repeated = {
        epoch: len(rows) - len(set(rows))
        for epoch, rows in by_epoch.items()
        if len(rows) != len(set(rows))
    }
    steps = [record["step"] for record in history]
    return Check(
        path=path,
        name="every step once, no row skipped or repeated within an epoch",
        passed=not repeated and steps == list(range(1, len(steps) + 1)),
        detail=f"steps {steps[:1]}..{steps[-1:]}, repeated rows per epoch {repeated}",
    )


def _resume_checks(
    summary: dict[str, Any],
    path: str,
    rng_restored: bool,
    stop_sha256: str,
    config: mini.MiniConfig,
) -> list[Check]:
    """A resumed path ran exactly the steps after the stop, from the stop's checkpoint, with its
    generators restored or deliberately not."""
    expected_run = list(range(MINI_STOP_STEP + 1, MINI_TOTAL_STEPS + 1))
    resumed = summary["resumed"] or {}
    return [
        _progress_check(summary, path, MINI_TOTAL_STEPS, config),
        _rows_check(summary, path),
        Check(
            path=path,
            name="ran exactly the steps after the stop",
            passed=summary["steps_run"] == expected_run,
            detail=f"{summary['steps_run']}, expected {expected_run}",
        ),
        Check(
            path=path,
            name="resumed from the stop path's checkpoint",
            passed=resumed.get("sha256") == stop_sha256 and resumed.get("step") == MINI_STOP_STEP,
            detail=f"sha256 {resumed.get('sha256')} at step {resumed.get('step')}",
        ),
        Check(
            path=path,
            name="random generators restored"
            if rng_restored
            else "random generators deliberately not restored",
            passed=resumed.get("rng_restored") is rng_restored,
            detail=f"rng_restored={resumed.get('rng_restored')}",
        ),
    ]


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
