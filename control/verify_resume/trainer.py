"""The trainer problem: the real andrea-trainer, stopped by a real SIGTERM, compared bit for bit."""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from andrea.control.compare import Comparison, compare_all, compare_arrays
from andrea.control.verify_options import TRAINER_SABOTAGES
from andrea.control.verify_resume.engine import (
    CONTINUOUS,
    FULL_RESUME,
    NO_CURSOR_RESUME,
    NO_RNG_RESUME,
    REPORT_NAME,
    STOP,
    Check,
    PathFigures,
    PathRecord,
    Tolerance,
    TrainerFigures,
    VerificationIncomplete,
    VerificationReport,
    _reused_report,
    _verify,
    run_path,
)
from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manager import checkpoint_steps, verify_checkpoint
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.data.tokenizer import BYTES
from andrea.daemon.rundir.layout import LOSS_FILE, bin_name
from andrea.daemon.rundir.losslog import LossLogError, canonical_curve, read_entries
from andrea.protocol.lossentry import LossEntry

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
#: The trainer's two negative controls and what each leaves out.
TRAINER_NEGATIVES = {NO_RNG_RESUME: "rng", NO_CURSOR_RESUME: "cursor"}


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
    cpu for the tiny preset), in how many processes (more than one: through
    ``torchrun --standalone``, DDP), and with which mixing: ``fixed`` (the trainer alone) or
    ``proxy`` (``--with-proxy``: every path's trainer starts andrea-proxy and stops it with
    itself, so a stop and a resume stop and restart the proxy too)."""

    model_config = ConfigDict(frozen=True)
    device: Literal["cpu", "cuda"] | None = None
    nproc: int = Field(default=1, ge=1)
    mixing: Literal["fixed", "proxy"] = "fixed"

    def prefix(self) -> list[str]:
        if self.nproc == 1:
            return [sys.executable, "-B", "-m", "andrea.daemon.trainer.service.cli"]
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
    # the proof (steps, cadence, the mixing, no samples) is the protocol's.
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
        *(["--with-proxy"] if launch.mixing == "proxy" else ["--mixing", "fixed"]),
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


def _verified(run_dir: Path, step: int) -> tuple[Manifest, checkpoint_format.Payload]:
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
    data = values.get("data", {})
    for arm in data.get("arms", []):
        if "paths" in arm:
            arm["paths"] = [p if Path(p).is_absolute() else str(base / p) for p in arm["paths"]]
        if arm.get("path") and not Path(arm["path"]).is_absolute():
            arm["path"] = str(base / arm["path"])
    # The run's own tokenizer is a path relative to the run directory too (daemon/data/tokenizer.py).
    tokenizer = data.get("tokenizer")
    if tokenizer and tokenizer != BYTES and not Path(tokenizer).expanduser().is_absolute():
        data["tokenizer"] = str(base / tokenizer)
    target = output / "user-config.toml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(tomli_w.dumps(values), encoding="utf-8")
    return target


def check_user_config(source: Path, follow_symlinks: bool = True) -> dict[str, Any]:
    """The values of a run config file, validated as the trainer validates them (ConfigError);
    without `follow_symlinks` a link is refused (a run directory's run.toml)."""
    from andrea.daemon.config import build_config, load_toml

    values = load_toml(source, follow_symlinks=follow_symlinks)
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
        stop_step = _reused_paths(reuse, launch, records)
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


def _reused_paths(reuse: Path, launch: TrainerLaunch, records: dict[str, PathRecord]) -> int:
    """Take the reference paths of an earlier passed proof of the same mixing into `records`;
    returns its stop step."""
    earlier = _reused_report(reuse, "trainer")
    if (earlier.mixing or "fixed") != launch.mixing:
        raise VerificationIncomplete(
            f"{reuse / REPORT_NAME}: a proof with --mixing {earlier.mixing or 'fixed'}; this "
            f"one runs --mixing {launch.mixing}, and only a proof of the same mixing is reused"
        )
    if earlier.stop_step is None:
        raise VerificationIncomplete(f"{reuse / REPORT_NAME}: records no stop step")
    earlier_paths = {record.name: record for record in earlier.paths}
    for name in (CONTINUOUS, STOP, *TRAINER_NEGATIVES):
        print(f"[-/5] {name:<16} reused from {reuse / name}", flush=True)
        records[name] = earlier_paths[name].model_copy(update={"reused_from": str(reuse / name)})
    return earlier.stop_step


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


def _trainer_identity(manifest: Manifest) -> dict[str, Any]:
    dump = manifest.model_dump(mode="json")
    return {
        key: dump[key]
        for key in ("model", "layout", "config_hash", "config", "mixing", "environment")
    } | {"data identities": [[c.name, c.identity, c.n_tokens, c.n_chunks] for c in manifest.data]}


def _trainer_resume_comparisons(
    continuous: _TrainerRun, stop: _TrainerRun, resumed: _TrainerRun, stop_step: int
) -> list[Comparison]:
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
    comparisons += _cadence_comparisons(continuous, resumed, stop_step)
    layout = continuous.manifest.layout
    comparisons += [
        compare_arrays("final weights", layout, [("weights", continuous.weights, resumed.weights)]),
        compare_arrays("final Adam m", layout, [("m", continuous.m, resumed.m)]),
        compare_arrays("final Adam v", layout, [("v", continuous.v, resumed.v)]),
    ]
    comparisons += compare_all(
        _final_state_quantities(continuous.manifest, resumed.manifest), TRAINER_ATOL
    )
    return comparisons


def _cadence_comparisons(
    continuous: _TrainerRun, resumed: _TrainerRun, stop_step: int
) -> list[Comparison]:
    """The cadence checkpoints the resumed segment wrote again, tensor for tensor."""
    comparisons = []
    for step in range(TRAINER_CHECKPOINT_EVERY, TRAINER_TOTAL_STEPS, TRAINER_CHECKPOINT_EVERY):
        if step > stop_step:
            (_, a), (_, b) = _verified(continuous.run_dir, step), _verified(resumed.run_dir, step)
            comparisons.append(
                compare_arrays(
                    f"checkpoint of step {step} (cadence): weights, m, v",
                    continuous.manifest.layout,
                    [("weights", a.weights, b.weights), ("m", a.m, b.m), ("v", a.v, b.v)],
                )
            )
    return comparisons


def _final_state_quantities(ref: Manifest, new: Manifest) -> dict[str, tuple[Any, Any]]:
    """Everything but the tensors that the final manifests record."""
    return {
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
    }


def _cursors(manifest: Manifest) -> str:
    return ", ".join(f"{c.name} {c.epoch}:{c.position}/{c.n_chunks}" for c in manifest.data)


def _trainer_checks(
    runs: dict[str, _TrainerRun], records: list[PathRecord], stop_step: int
) -> list[Check]:
    signal_sent = next(r.signal_sent for r in records if r.name == STOP)
    checks = [
        _continuous_check(runs[CONTINUOUS]),
        *_stop_checks(runs[STOP], stop_step, signal_sent),
    ]
    for path, skipped in [(FULL_RESUME, None), *TRAINER_NEGATIVES.items()]:
        checks += _resume_checks(runs[path], path, skipped, stop_step)
    return checks


def _steps_of(run: _TrainerRun, segment: int) -> list[int]:
    return [e.step for e in run.entries if e.segment == segment]


def _steps_detail(steps: list[int]) -> str:
    return f"{len(steps)} entries, steps {steps[:1]}..{steps[-1:]}"


def _continuous_check(continuous: _TrainerRun) -> Check:
    last = TRAINER_TOTAL_STEPS
    return Check(
        path=CONTINUOUS,
        name=f"one process life trained steps 1-{last}, each once, and checkpointed the end",
        passed=_steps_of(continuous, 1) == list(range(1, last + 1))
        and len(continuous.entries) == last
        and (continuous.manifest.step, continuous.manifest.trigger) == (last, "end"),
        detail=f"{_steps_detail(_steps_of(continuous, 1))}; final checkpoint step "
        f"{continuous.manifest.step}, trigger {continuous.manifest.trigger}",
    )


def _stop_checks(stop: _TrainerRun, stop_step: int, signal_sent: str | None) -> list[Check]:
    return [
        Check(
            path=STOP,
            name="stopped by a real SIGTERM between cadence points, checkpointing the step it finished",
            passed=(stop.manifest.step, stop.manifest.trigger) == (stop_step, "sigterm")
            and _steps_of(stop, 1) == list(range(1, stop_step + 1))
            and len(stop.entries) == stop_step,
            detail=f"step {stop.manifest.step}, trigger {stop.manifest.trigger} ({signal_sent}); "
            f"cadence every {TRAINER_CHECKPOINT_EVERY}; loss log: {_steps_detail(_steps_of(stop, 1))}",
        ),
        Check(
            path=STOP,
            name="stops mid-epoch (some arm's cursor is inside its order)",
            passed=any(0 < c.position < c.n_chunks for c in stop.manifest.data),
            detail=f"cursors (epoch:position/chunks): {_cursors(stop.manifest)}",
        ),
    ]


def _resume_checks(run: _TrainerRun, path: str, skipped: str | None, stop_step: int) -> list[Check]:
    """A resumed path continued the stop's checkpoint in a second life, skipping exactly the restore
    it was told to skip (``skipped``; None: none)."""
    last = TRAINER_TOTAL_STEPS
    first_segment, second_segment = _steps_of(run, 1), _steps_of(run, 2)
    resumed = Check(
        path=path,
        name=f"resumed from the stop checkpoint, trained exactly steps {stop_step + 1}-{last} in a second life",
        passed=f"resumed from {bin_name(stop_step)}" in run.log
        and first_segment == list(range(1, stop_step + 1))
        and second_segment == list(range(stop_step + 1, last + 1))
        and len(run.entries) == last
        and run.manifest.step == last,
        detail=f"segment 1: {_steps_detail(first_segment)}; segment 2: {_steps_detail(second_segment)}; "
        f"final checkpoint step {run.manifest.step}",
    )
    unsafe = re.search(r"UNSAFE: skipping restore of (\S+)", run.log)
    if skipped is None:
        restore = Check(
            path=path,
            name="complete restore",
            passed=unsafe is None,
            detail=unsafe.group(0) if unsafe else "nothing skipped",
        )
    else:
        restore = Check(
            path=path,
            name=f"restore of {skipped} deliberately skipped",
            passed=unsafe is not None and unsafe.group(1) == skipped,
            detail=unsafe.group(0)
            if unsafe
            else "the trainer did not announce the skipped restore",
        )
    return [resumed, restore]


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

    Five fresh ``andrea-trainer`` processes (tiny preset, CPU, one thread; the fixed mixture, or
    andrea-proxy in the loop with ``launch.mixing == "proxy"``): continuous, stop (a real SIGTERM
    mid-run), full resume, and two negative controls that skip restoring the RNGs or the data
    cursors. Everything is compared bit for bit. ``sabotage`` (a key of
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
        mixing=(launch or TrainerLaunch()).mixing,
        completed=False,
        tolerance=Tolerance(absolute=TRAINER_ATOL),
        sabotage=sabotage,
        stop_step=None,
        final_step=TRAINER_TOTAL_STEPS,
    )
    return _verify(output, report, list(TRAINER_SABOTAGES), body)
