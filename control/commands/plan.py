"""``andreactl plan`` (memory, time and disk of a run before renting GPUs) and ``size`` (its
parameters and checkpoint bytes alone). Both read a preset, a run.toml (``--config``) or a run
directory's own run.toml (``--run-dir``); torch-free (control/planning.py, control/sizing.py).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from dataclasses import replace
from pathlib import Path

from andrea.control import datasize, reports, scaling, sizing
from andrea.control.commands.conventions import EXIT_OK, Command, UserError, emit
from andrea.control.offline import tail_entries
from andrea.control.planning import (
    GB,
    GPUS,
    STRATEGIES,
    GiB,
    GpuSpec,
    PlanInputs,
    gpu_of,
    make_plan,
    steps_in_window,
)
from andrea.daemon.config import (
    PRESETS,
    ConfigError,
    RunConfig,
    build_config,
    for_new_run,
    load_toml,
)
from andrea.daemon.data.batch_split import batch_shape, step_sequences
from andrea.daemon.rundir.layout import CONFIG_FILE, LOSS_FILE, RUN_DIR_ENV, recorded_config

DEFAULT_MFU = 0.30


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--preset", choices=list(PRESETS), help="a preset's model and defaults")
    group.add_argument(
        "--config",
        type=Path,
        metavar="run.toml",
        help="a run config (default, with --run-dir: the run's own run.toml)",
    )


def _plan_arguments(parser: argparse.ArgumentParser) -> None:
    _source_arguments(parser)
    parser.add_argument("--gpu", choices=list(GPUS), default="h100", help="the GPU to rent")
    parser.add_argument("--gpu-memory-gb", type=float, help="another GPU: its memory (GB)")
    parser.add_argument("--gpu-tflops", type=float, help="another GPU: its dense peak TFLOPS")
    parser.add_argument(
        "--gpu-allreduce-gbps", type=float, help="another GPU: all-reduce bus bandwidth (GB/s)"
    )
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the job (world size)")
    parser.add_argument("--batch-size", type=int, help="sequences per optimizer step, whole job")
    parser.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    parser.add_argument(
        "--precision", choices=("auto", "fp32", "tf32", "bf16"), help="default: the config's"
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        help="how the GPUs hold the model: ddp (each the whole state) or fsdp (sharded); default: "
        "the config's [distributed] strategy (a preset's: ddp); every option is compared in any "
        "case",
    )
    parser.add_argument(
        "--recompute",
        choices=("none", "blocks"),
        help="activation recompute per block (default: the config's [model] recompute)",
    )
    parser.add_argument("--steps", type=int, help="planned steps (default: max_steps)")
    parser.add_argument(
        "--days",
        type=float,
        help="plan backwards: the steps and tokens a rental window of this many days holds "
        "(instead of --steps)",
    )
    parser.add_argument(
        "--mfu",
        type=float,
        help="model FLOPs utilisation to assume, 0-1 (default: measured in --run-dir's run, else "
        f"{DEFAULT_MFU:g})",
    )
    parser.add_argument("--disk-gbps", type=float, default=1.0, help="disk bandwidth, GB/s")
    parser.add_argument(
        "--staging-gbps", type=float, default=20.0, help="device-to-host copy, GB/s"
    )
    parser.add_argument(
        "--startup-seconds", type=float, default=120.0, help="one start of the trainer"
    )


def load_config(args: argparse.Namespace) -> tuple[RunConfig, str]:
    """The config the command sizes, and where it came from. A preset is sized as a new run;
    without a source, `$ANDREA_RUN_DIR` stands in for --run-dir as for the other commands."""
    if not (args.preset or args.config or args.run_dir) and os.environ.get(RUN_DIR_ENV):
        args.run_dir = Path(os.environ[RUN_DIR_ENV])
    try:
        if args.preset:
            return for_new_run(build_config(overrides={"preset": args.preset})), args.preset
        # A run directory's config is the one it trains under (its flags included).
        path = args.config or (_run_config(args.run_dir) if args.run_dir else None)
        if path is None:
            raise UserError("say what to size: --preset NAME, --config run.toml or --run-dir DIR")
        return build_config(load_toml(path), source=str(path)), str(path)
    except ConfigError as e:
        raise UserError(str(e)) from None


def _run_config(run_dir: Path) -> Path:
    return recorded_config(run_dir) or run_dir / CONFIG_FILE


def _batched(cfg: RunConfig, args: argparse.Namespace) -> RunConfig:
    """`cfg` with the plan's batch (per step, the whole job) and precision settings."""
    dump = cfg.model_dump()
    if args.batch_size is not None or args.grad_accum is not None:
        dump["batch_size"] = step_sequences(cfg) if args.batch_size is None else args.batch_size
        dump["grad_accum"] = cfg.grad_accum if args.grad_accum is None else args.grad_accum
        dump["batch_size_per"] = "step"
    if args.precision is not None:
        dump["precision"] = args.precision
    try:
        return RunConfig.model_validate(dump)
    except ValueError as e:
        raise UserError(f"invalid plan: {e}") from None


def _gpu(args: argparse.Namespace) -> GpuSpec:
    spec = GPUS[args.gpu]
    given = (args.gpu_memory_gb, args.gpu_tflops, args.gpu_allreduce_gbps)
    if all(v is None for v in given):
        return spec
    tflops = args.gpu_tflops
    return GpuSpec(
        "custom",
        int((args.gpu_memory_gb or spec.memory_bytes / GB) * GB),
        tflops or spec.bf16_tflops,
        tflops or spec.tf32_tflops,
        tflops or spec.fp32_tflops,
        args.gpu_allreduce_gbps or spec.allreduce_gbps,
    )


def _precision(cfg: RunConfig) -> str:
    # Every GPU of the table runs bf16, which `auto` chooses on such a GPU.
    return "bf16" if cfg.precision == "auto" else cfg.precision


def measured_mfu(run_dir: Path, cfg: RunConfig) -> tuple[float, str] | str:
    """The MFU a run reached: its newest segment's tokens/s in .loss.json (the median step), on
    the GPUs its newest manifest names; or why it cannot be told (no checkpoint or steps yet, a
    run on a CPU, whose MFU says nothing of a GPU's, a GPU not in the table)."""
    manifest = datasize.newest_manifest(run_dir)
    if manifest is None:
        return f"{run_dir} has no readable checkpoint yet to say where it trained"
    try:
        env = dict(manifest.get("environment", {}))
        entries = tail_entries(run_dir / LOSS_FILE)
    except (OSError, ValueError, AttributeError, TypeError):
        return f"{run_dir} has no readable {LOSS_FILE}"
    gpu = gpu_of(env.get("gpu"))
    if gpu is None:
        where = env.get("gpu") or env.get("device") or "an unknown device"
        what = "a CPU's MFU says nothing of a GPU's" if not env.get("gpu") else "not in the table"
        return f"the run in {run_dir} trained on {where} ({what})"
    segment = [e for e in entries if entries and e.segment == entries[-1].segment]
    gaps = [b.wall_time - a.wall_time for a, b in zip(segment, segment[1:]) if b.step == a.step + 1]
    if len(gaps) < 3:
        return f"the run in {run_dir} has too few consecutive steps logged to time"
    dtype = str(env.get("dtype", ""))
    precision = "bf16" if "bfloat16" in dtype else "tf32" if "tf32" in dtype else "fp32"
    tps = segment[-1].tokens / statistics.median(gaps)
    world = int(env.get("world_size", 1))
    mfu = tps * sizing.flops_per_token(cfg.model) / (world * gpu.peak(precision) * 1e12)
    return mfu, f"measured in {run_dir}: {tps:,.0f} tokens/s on {world} {gpu.name} at {precision}"


def cmd_plan(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Per-GPU memory, the batch per GPU, step time, disk and rental hours of a run."""
    _check_figures(args)
    cfg, source = load_config(args)
    cfg = _batched(cfg, args)
    try:
        shape = batch_shape(cfg, args.gpus)
    except ConfigError as e:
        raise UserError(str(e)) from None
    if args.days is not None and args.steps is not None:
        raise UserError("give --steps or --days, not both: --days plans the steps")
    mfu = _mfu(args, cfg)
    inputs = PlanInputs(
        source=source,
        gpu=_gpu(args),
        gpus=args.gpus,
        precision=_precision(cfg),
        steps=args.steps if args.steps is not None else cfg.max_steps,
        mfu=mfu[0],
        mfu_source=mfu[1],
        disk_gbps=args.disk_gbps,
        staging_gbps=args.staging_gbps,
        startup_seconds=args.startup_seconds,
        data_tokens=_data_tokens(args, cfg, source),
        strategy=args.strategy or cfg.distributed.strategy,
        recompute=(args.recompute or cfg.model.recompute) == "blocks",
    )
    window = None
    if args.days is not None:
        inputs = replace(inputs, steps=steps_in_window(cfg, shape, inputs, args.days))
    report = make_plan(cfg, shape, inputs)
    if args.days is not None:
        window = reports.PlanWindow(
            days=args.days,
            steps=inputs.steps,
            tokens=inputs.steps * shape.tokens_per_step,
            hours=report.rental.total_hours,
        )
        report = report.model_copy(update={"window": window})
    scaling_mfu = (
        (args.mfu, "given")
        if args.mfu is not None
        else (scaling.DEFAULT_SCALING_MFU, "assumed for models of billions of parameters")
    )
    sizes = scaling.scaling(cfg.model, inputs.gpu, inputs.gpus, inputs.precision, scaling_mfu)
    report = report.model_copy(update={"scaling": sizes})
    emit(args, report, plan_text(report))
    return EXIT_OK


def _mfu(args: argparse.Namespace, cfg: RunConfig) -> tuple[float, str]:
    """The MFU to plan at and where it comes from: given, measured in --run-dir's run on a GPU,
    or assumed, saying why it was not measured."""
    if args.mfu is not None:
        return args.mfu, "given"
    assumed = f"assumed {DEFAULT_MFU:.0%}, a small model in eager mode"
    if args.run_dir is None or args.preset or args.config:
        return DEFAULT_MFU, f"{assumed}; measure it with --run-dir of a run on a GPU"
    measured = measured_mfu(args.run_dir, cfg)
    if isinstance(measured, str):
        return DEFAULT_MFU, f"{assumed}, not measured: {measured}"
    return measured


def _data_tokens(args: argparse.Namespace, cfg: RunConfig, source: str) -> tuple[int, str] | None:
    """The run's training tokens: counted in --run-dir's newest checkpoint, else estimated from
    the arms' files (relative to the run directory, or to the config's directory)."""
    if args.run_dir is not None and not args.preset and not args.config:
        found = datasize.counted(args.run_dir) or datasize.estimated(cfg, args.run_dir)
    elif args.config is not None:
        found = datasize.estimated(cfg, args.config.parent)
    else:
        return None  # a preset names no data of the user's
    return (found.tokens, found.how) if found else None


#: The numeric options of plan: (lowest, whether the lowest itself is allowed, highest). Each bound
#: is far past any machine (10 TB of GPU memory, a million TFLOPS, a week to start) but excludes
#: 0 where it would divide, and nan, inf and 1e300, which turned into tracebacks or "nan GB/s".
_FIGURES: dict[str, tuple[float, bool, float]] = {
    "gpus": (1, True, 1_000_000),
    "batch_size": (1, True, 10**9),
    "grad_accum": (1, True, 10**9),
    "steps": (0, True, 10**12),
    "days": (0, False, 3650),
    "mfu": (0, False, 1),
    "gpu_memory_gb": (0, False, 10_000),
    "gpu_tflops": (0, False, 1_000_000),
    "gpu_allreduce_gbps": (0, False, 100_000),
    "disk_gbps": (0, False, 10_000),
    "staging_gbps": (0, False, 10_000),
    "startup_seconds": (0, True, 7 * 86_400),
}


def _check_figures(args: argparse.Namespace) -> None:
    """Refuse every figure outside its plausible range (exit 2), naming the option."""
    for name, (low, inclusive, high) in _FIGURES.items():
        value = getattr(args, name)
        if value is None:
            continue
        above = value >= low if inclusive else value > low
        if not (math.isfinite(value) and above and value <= high):
            option = "--" + name.replace("_", "-")
            raise UserError(
                f"{option} {value!r} is out of range: it takes a number "
                f"{'>=' if inclusive else '>'} {low:g} and <= {high:g}"
            )


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 3600 else f"{seconds / 60:,.1f} min"


def _option(strategy: str, recompute: bool) -> str:
    return strategy + (" + recompute" if recompute else "")


def _memory_lines(p: reports.PlanReport) -> list[str]:
    m = p.memory
    return [
        f"per GPU ({p.gpu.name}, {_gib(m.gpu_memory)}) under {_option(m.strategy, m.recompute)}: "
        f"weights {_gib(m.weights)}, gradients {_gib(m.gradients)}, Adam moments "
        f"{_gib(m.adam_moments)}, bf16 weight copies {_gib(m.bf16_weight_copies)}, gathered "
        f"units {_gib(m.gathered)}, activations {_gib(m.activations)} "
        f"({_gib(m.activations_per_sequence)} per sequence, {m.attention} attention), "
        f"checkpoint staging {_gib(m.checkpoint_staging)} (host: {_gib(m.host_staging)} pinned "
        f"on rank 0's machine), runtime {_gib(m.runtime_reserve)}",
        f"  total {_gib(m.total)}, headroom {_gib(m.headroom)}"
        + ("" if m.fits else " (DOES NOT FIT)")
        + f"; largest micro-batch that fits: {m.largest_micro_batch} sequences per GPU",
    ]


def _strategy_lines(p: reports.PlanReport) -> list[str]:
    """Each option on one line, the recommendation, and the windows' compute-optimal sizes."""
    lines = [
        f"  {_option(o.strategy, o.recompute)}: state {_gib(o.state_bytes)}, "
        f"{_gib(o.activations_per_sequence)} a sequence; "
        + (
            f"holds up to {o.largest_micro_batch} sequences per GPU micro-batch"
            + ("" if o.fits else f" (not the planned {p.batch.sequences_per_gpu_micro_batch})")
            if o.largest_micro_batch
            else "DOES NOT HOLD the model"
        )
        + f"; {o.step_seconds * 1000:,.1f} ms a step"
        for o in p.options
    ]
    r = p.recommended
    lines.insert(
        0,
        "strategies: "
        + (
            f"recommended {_option(r.strategy, r.recompute)} (--strategy {r.strategy}, [model] "
            f'recompute = "{"blocks" if r.recompute else "none"}"): {r.why}'
            if r is not None
            else "none holds the model on these GPUs: more GPUs, or a GPU with more memory"
        ),
    )
    if (sc := p.scaling) is not None:
        held = ", ".join(f"{s} {n / 1e9:,.2f}B" for s, n in sc.largest_params.items())
        lines.append(
            f"compute-optimal (Chinchilla: {sc.tokens_per_param:g} tokens a parameter, C = 6 N D, "
            f"at {sc.mfu:.0%} MFU, {sc.mfu_source}): "
            + "; ".join(
                f"{w.days} days: {w.params / 1e9:,.2f}B parameters on {w.tokens / 1e9:,.0f}B "
                "tokens, held by "
                + (" and ".join(s for s, ok in w.holds.items() if ok) or "neither")
                for w in sc.windows
            )
            + f"; the largest model each holds (one sequence a GPU, recompute): {held}"
        )
    return lines


def plan_text(p: reports.PlanReport) -> str:
    """The plan for a person: one line per figure group, then the assumptions and warnings."""
    b, s, c, t = p.batch, p.speed, p.checkpoints, p.rental
    lines = [
        f"{p.source}: {p.preset}, {p.n_params:,} parameters ({_gib(p.parameter_bytes)}; "
        f"optimizer {_gib(p.optimizer_bytes)}), {p.precision}, {p.gpu.count} x {p.gpu.name}",
        f"batch: {b.sequences_per_step} sequences per step = {b.tokens_per_step:,} tokens; "
        f"{b.grad_accum} micro-batch(es) of {b.sequences_per_micro_batch}; per GPU "
        f"{b.tokens_per_gpu_per_step:,} tokens per step, {b.sequences_per_gpu_micro_batch} "
        f"sequences ({b.tokens_per_gpu_micro_batch:,} tokens) per micro-batch",
        *_memory_lines(p),
        *_strategy_lines(p),
        f"speed at {s.mfu:.0%} MFU ({s.mfu_source}): {s.step_seconds * 1000:,.1f} ms per step "
        f"({s.compute_seconds * 1000:,.1f} compute + {s.allreduce_seconds * 1000:,.1f} "
        f"all-reduce), {s.tokens_per_second:,.0f} tokens/s; {s.steps:,} steps in "
        f"{_hours(s.training_seconds)}"
        + (
            f" (the floor of {s.floor_seconds * 1000:,.1f} ms a step, the host's dispatch)"
            if s.step_seconds == s.floor_seconds
            else ""
        ),
        _data_line(p),
        f"checkpoints: {c.payload_bytes / GB:,.2f} GB each, written in {c.write_seconds:,.1f} s "
        f"at {c.disk_gbps:g} GB/s; stall {c.stall_seconds:,.2f} s per cadence (every "
        f"{c.every}); disk {c.disk_bytes / GB:,.1f} GB ({c.kept_cadence} cadence + "
        f"{c.kept_audit} audit checkpoints, the loss log, the export)",
        f"rental: {t.total_hours:,.1f} h = training {t.training_hours:,.1f} + checkpoint stalls "
        f"{t.checkpoint_stall_hours:,.2f} + evaluation {t.evaluation_hours:,.2f} + one stop and "
        f"resume {t.stop_resume_hours:,.2f} + export and verification {t.export_hours:,.2f}; "
        + ", ".join(
            f"{d}-day window: {'fits' if ok else 'too short'}" for d, ok in t.fits_days.items()
        ),
        "assumptions: " + "; ".join(f"{k}: {v}" for k, v in p.assumptions.items()),
    ]
    if (w := p.window) is not None:
        lines.insert(
            1,
            f"in {w.days:g} day(s): {w.steps:,} steps, {w.tokens:,} tokens "
            f"({w.hours:,.1f} rental hours of {w.days * 24:,.1f}; the figures below are theirs)"
            if w.steps
            else f"in {w.days:g} day(s): no step; one stop, resume and export alone take longer",
        )
    lines += [f"WARNING: {w}" for w in p.warnings]
    return "\n".join(lines)


def _data_line(p: reports.PlanReport) -> str:
    d = p.data
    if d is None:
        return (
            "data: passes not known: --run-dir or --config names the data to count (a preset"
            " has none of yours), and its files must be there"
        )
    passes = "no training tokens" if d.passes is None else f"{d.passes:,.2f} passes"
    return (
        f"data: {passes} over {d.training_tokens:,} training tokens "
        f"({d.planned_tokens:,} planned; {d.how})"
    )


def cmd_size(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Parameter count and checkpoint size (8 + 12 bytes per parameter) of a model."""
    cfg, _ = load_config(args)
    params = sizing.parameters(cfg.model)
    size = params.checkpoint_bytes
    emit(
        args,
        reports.SizeReport(preset=cfg.preset, n_params=params.n_params, checkpoint_bytes=size),
        f"{cfg.preset}: {params.n_params:,} parameters, checkpoint {size:,} bytes "
        f"({size / 1e6:.1f} MB)",
    )
    return EXIT_OK


PLAN = Command(
    "plan",
    "memory per GPU, step time, disk and rental hours of a run, before renting",
    _plan_arguments,
    cmd_plan,
    needs_run_dir=False,
    examples=(
        "andreactl plan --preset andrea-120m --gpu h200 --gpus 8 --steps 200000",
        "andreactl plan --preset gpt3-6.7b --gpus 8 --batch-size 64 --strategy fsdp --recompute blocks",
        "andreactl plan --run-dir runs/r1 --gpu a100-80gb --gpus 2",
        "andreactl plan --config run.toml --gpu-memory-gb 24 --gpu-tflops 165 --json",
    ),
)
SIZE = Command(
    "size",
    "parameters and checkpoint bytes of a model (the first lines of plan)",
    _source_arguments,
    cmd_size,
    needs_run_dir=False,
    examples=("andreactl size --preset andrea-120m", "andreactl size --run-dir runs/r1"),
)
