"""What a few steps on an unlearnable arm cost, and how much a run moves when its steps are merely
reordered: the two figures that say what the mixing benchmark can resolve.

    nice -n 10 .venv/bin/python tests/bench/bench_exposure.py [--steps 1500] [--batch-size 32]
        [--seeds 1 2 3 4 5] [--variants base early-random early-shift late-random measured
        uniform cut-at-plateau cut-150] [--extra random] [--plateau-fall F] [--jobs 2]
        [--out-dir DIR]

Each run trains andrea-tiny on the three stdlib arms, uniformly, each step's arm drawn from the
bandit's own per-step uniforms (`draw_uniform`, phase 0, the arms in name order: the arm sequence of
bench_mixing.py's uniform-learnable-paired runs). The first four variants change five steps of that
sequence and nothing else:
- base: none;
- early-random: steps 5, 12, 20, 35 and 50 train on the `random` arm of bench_mixing.py (4,096 random
  bytes per file) instead;
- early-shift: the same five steps train on the next learnable arm instead (code -> comments ->
  docstrings -> code): no foreign data, only the arms' batches moved by a step — how much the
  trajectory moves when its order alone changes;
- late-random: the random arm at five steps spread over the last third (2/3, 11/15, 4/5, 13/15
  and 14/15 of the run).
The others draw every step over the four arms (a quarter each, the `--extra` arm of bench_mixing.py
last: `random` by default, or `dup`, `letters` or `synth8`) for a while:
- uniform: all along (bench_mixing.py's uniform-paired of the case whose extra arm it is);
- measured: until the extra arm's third loss is known (W = 8 steps after its third step), then
  over the three learnable arms only: what a bandit that must train an arm 3 times to measure it,
  with the proxy's lag, and never explores it again, would do at best;
- cut-at-plateau: until the extra arm's plateau in the uniform run of the same seed (the first step
  at which its training loss, the mean of its last 10, is within 2% of its final value, as
  bench_mixing.py reports it; or, with --plateau-fall F, has come F of the way from its first
  value to its final one), then over the three: what a bandit that sees an arm's plateau at once,
  and never trains it again, would do at best (the uniform run is run first);
- cut-150: the same, 150 steps after the plateau (issue #35's target for seeing it).
The held-out mean over the three arms at the last step, against base of the same seed, is reported
per seed. The loop is the trainer's step in process (its model, data streams, AdamW, LR schedule,
gradient clipping and evaluator; not the daemon, which cannot be told to train given arms at given
steps). Writes exposure.json and exposure.md to --out-dir.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from bench_mixing import LEARNABLE, PLATEAU_MARGIN, smoothed, write_inputs, write_results

from andrea.daemon.config import (
    PRESETS,
    ArmSpec,
    DataConfig,
    ModelConfig,
    OptimConfig,
    default_arms,
)
from andrea.daemon.data.arms import ArmStream, load_arms
from andrea.daemon.data.heldout import DEFAULT_FRACTION
from andrea.daemon.mixing.bandit import draw_uniform
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.reward import WARMUP_PULLS
from andrea.daemon.model import GPT
from andrea.daemon.trainer.heldout_loss import Evaluator
from andrea.daemon.trainer.parts import adamw
from andrea.daemon.trainer.platform.precision import resolve
from andrea.daemon.trainer.schedule import lr_at

VARIANTS = (
    "base",
    "early-random",
    "early-shift",
    "late-random",
    "measured",
    "uniform",
    "cut-at-plateau",
    "cut-150",
)
#: The variants that cut the extra arm some steps after its plateau in the uniform run.
CUTS = {"cut-at-plateau": 0, "cut-150": 150}
EARLY = (5, 12, 20, 35, 50)
LATE_FRACTIONS = (2 / 3, 11 / 15, 4 / 5, 13 / 15, 14 / 15)
#: The proxy's default lag W, and the steps of its own an arm needs to be measured
#: (`reward.WARMUP_PULLS`).
LAG = Policy().lag
MEASURED_PULLS = WARMUP_PULLS


def arm_sequence(
    variant: str, seed: int, steps: int, extra: str = "random", plateau: int = 0
) -> list[str]:
    """The arm of each step 1..steps (the draw of each step: the bandit's, arms in name order);
    `plateau`, for the cut variants: the extra arm's plateau step in the uniform run."""
    order = sorted(LEARNABLE)
    draws = [draw_uniform(seed, 0, s) for s in range(1, steps + 1)]
    if variant in CUTS:
        return measured_sequence(draws, [*order, extra], plateau + CUTS[variant])
    if variant in ("measured", "uniform"):
        return measured_sequence(draws, [*order, extra], steps if variant == "uniform" else 0)
    arms = [order[min(int(u * 3), 2)] for u in draws]
    late = [round(f * steps) for f in LATE_FRACTIONS]
    at = {"base": (), "early-random": EARLY, "early-shift": EARLY, "late-random": late}[variant]
    for s in at:
        prev = arms[s - 1]
        arms[s - 1] = order[(order.index(prev) + 1) % 3] if variant == "early-shift" else "random"
    return arms


def measured_sequence(draws: list[float], four: list[str], until: int) -> list[str]:
    """Uniform over `four` up to step `until`, or (until 0) up to the step at which the third
    loss of its last arm is known (LAG steps after that arm's third step); uniform over the
    other three from then on."""
    arms: list[str] = []
    known = until or None
    for step, u in enumerate(draws, start=1):
        if known is None or step <= known:
            arms.append(four[min(int(u * 4), 3)])
            if known is None and arms.count(four[-1]) == MEASURED_PULLS:
                known = step + LAG
        else:
            arms.append(four[min(int(u * 3), 2)])
    return arms


def plateau_step(losses: list[tuple[int, float]], fall: float | None = None) -> int:
    """The first step at which the mean of the arm's last 10 training losses (`losses`: its
    steps and losses in order) is within PLATEAU_MARGIN of its final value; with `fall`, the first
    at which it has come that fraction of the way from its first loss down to its final value (an
    arm learnt towards 0 is within 2% of its final value only once it is within a few thousandths
    of a nat of it, often late in the run)."""
    smooth = smoothed(losses)
    final = smooth[-1][1]
    if fall is not None:
        level = final + (1 - fall) * (losses[0][1] - final)
    else:
        level = final * (1 + PLATEAU_MARGIN)
    return next(s for s, m in smooth if m <= level)


def one_run(variant: str, seed: int, args: argparse.Namespace, plateau: int = 0) -> dict:
    """Train one arm sequence; the held-out loss of each learnable arm at the last step, and the
    extra arm's training losses."""
    torch.set_num_threads(1)
    specs = [*default_arms(), ArmSpec(name=args.extra, kind="text", paths=[f"{args.extra}/*.txt"])]
    preset = PRESETS["andrea-tiny"]
    model_cfg = ModelConfig(**preset["model"])
    optim = OptimConfig(**{**preset["optim"], "decay_steps": args.steps})
    data = load_arms(
        DataConfig(arms=specs, heldout_fraction=DEFAULT_FRACTION),
        Path(args.work_dir),
        model_cfg.vocab_size,
    )
    torch.manual_seed(seed)
    streams = {a.name: ArmStream(a, seed, model_cfg.block_size) for a in data}
    model = GPT(model_cfg)
    opt = adamw(model, optim)
    t0 = time.perf_counter()
    extra_losses = []
    sequence = arm_sequence(variant, seed, args.steps, args.extra, plateau)
    for step, arm in enumerate(sequence, start=1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, optim)
        opt.zero_grad()
        xy = torch.from_numpy(streams[arm].next_batch(args.batch_size))
        _, loss = model(xy[:, :-1], xy[:, 1:])
        if arm == args.extra:
            extra_losses.append((step, loss.item()))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), optim.grad_clip, foreach=True)
        opt.step()
    learnable = [a for a in data if a.name in LEARNABLE]
    evaluator = Evaluator(
        learnable, model_cfg.block_size, 128, args.batch_size, torch.device("cpu")
    )
    result = evaluator.evaluate(model, resolve("auto", torch.device("cpu")), lambda: False)
    assert result is not None
    held = {n: r.loss for n, r in result.losses.items()}
    return {
        "variant": variant,
        "seed": seed,
        "heldout": held,
        "mean": statistics.fmean(held.values()),
        "seconds": time.perf_counter() - t0,
        "extra_losses": extra_losses,
        "extra_steps": len(extra_losses),
        "cut_step": plateau + CUTS[variant] if variant in CUTS else None,
    }


def markdown(runs: list[dict], args: argparse.Namespace) -> str:
    by = {(r["variant"], r["seed"]): r["mean"] for r in runs}
    seeds = sorted({r["seed"] for r in runs})
    lines = [
        f"andrea-tiny, {args.batch_size} sequences per step, {args.steps} steps, uniform over "
        f"{', '.join(LEARNABLE)}; held-out mean at step {args.steps}, and against base.",
        "",
        "| variant | mean | " + " | ".join(f"seed {s}" for s in seeds) + " |",
        "|---|---|" + "---|" * len(seeds),
    ]
    for v in [v for v in VARIANTS if any(r["variant"] == v for r in runs)]:
        d = [by[(v, s)] - by[("base", s)] for s in seeds]
        cells = [
            f"{by[(v, s)]:.4f}" + (f" ({x:+.4f})" if v != "base" else "") for s, x in zip(seeds, d)
        ]
        mean = statistics.fmean(by[(v, s)] for s in seeds)
        lines.append(f"| {v} | {mean:.4f} | " + " | ".join(cells) + " |")
    extra = [r for r in runs if r["extra_steps"]]
    if extra:
        lines += ["", f"Steps trained on {args.extra}, and where a cut variant stopped it:", ""]
        for r in sorted(extra, key=lambda r: (VARIANTS.index(r["variant"]), r["seed"])):
            cut = f", from step {r['cut_step']} on: none" if r["cut_step"] is not None else ""
            lines.append(f"- {r['variant']}, seed {r['seed']}: {r['extra_steps']}{cut}")
    return "\n".join(lines) + "\n"


def run_all(
    pool: ProcessPoolExecutor, jobs: list[tuple[str, int, int]], args: argparse.Namespace, t0: float
) -> list[dict]:
    """Run (variant, seed, plateau) jobs in the pool, reporting each as it ends."""
    runs = []
    futures = [pool.submit(one_run, v, s, args, plateau) for v, s, plateau in jobs]
    for fut in futures:
        run = fut.result()
        runs.append(run)
        cut = f", cut at step {run['cut_step']}" if run["cut_step"] is not None else ""
        print(
            f"[{time.perf_counter() - t0:6.0f} s] {run['variant']:14s} seed {run['seed']}: "
            f"mean {run['mean']:.4f}, {run['extra_steps']} steps on {args.extra}{cut}"
            f" ({run['seconds']:.0f} s)",
            flush=True,
        )
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    # The default: the five-step variants (the others each answer their own question).
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS[:4]))
    p.add_argument(
        "--extra",
        choices=("random", "dup", "letters", "synth8"),
        default="random",
        help="the fourth arm of the variants that draw over four (bench_mixing.py's cases b to e)",
    )
    p.add_argument(
        "--plateau-fall",
        type=float,
        help="the cut variants' plateau: the first step at which the extra arm's training loss has "
        "come this fraction (e.g. 0.98) of the way from its first value to its final one, instead "
        "of within 2%% of its final value",
    )
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "andrea-bench-exposure",
    )
    args = p.parse_args()
    if args.extra != "random" and {"early-random", "late-random"} & set(args.variants):
        p.error("early-random and late-random train the random arm: run them with --extra random")
    if "base" not in args.variants:
        args.variants.insert(0, "base")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="andrea-exposure-") as work:
        args.work_dir = work
        write_inputs(Path(work))
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            # The cut variants need the uniform run of their seed: it runs first.
            first = [v for v in args.variants if v not in CUTS]
            if any(v in CUTS for v in args.variants) and "uniform" not in first:
                first.append("uniform")
            done = run_all(pool, [(v, s, 0) for s in args.seeds for v in first], args, t0)
            plateaus = {
                r["seed"]: plateau_step(r["extra_losses"], args.plateau_fall)
                for r in done
                if r["variant"] == "uniform"
            }
            cuts = [(v, s, plateaus[s]) for s in args.seeds for v in args.variants if v in CUTS]
            runs = done + run_all(pool, cuts, args, t0)
    args_out = {k: str(v) for k, v in vars(args).items() if k != "work_dir"}
    doc = {"args": args_out, "seconds": time.perf_counter() - t0, "runs": runs}
    write_results(args.out_dir, "exposure", doc, markdown(runs, args))


if __name__ == "__main__":
    main()
