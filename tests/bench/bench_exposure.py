"""What a few steps on an unlearnable arm cost, and how much a run moves when its steps are merely
reordered: the two figures that say what the mixing benchmark can resolve.

    nice -n 10 .venv/bin/python tests/bench/bench_exposure.py [--steps 1500] [--batch-size 32]
        [--seeds 1 2 3 4 5] [--variants base early-random early-shift late-random measured
        uniform] [--jobs 2] [--out-dir DIR]

Each run trains andrea-tiny on the three stdlib arms, uniformly, each step's arm drawn from the
bandit's own per-step uniforms (`draw_uniform`, phase 0, the arms in name order: the arm sequence of
bench_mixing.py's uniform-learnable-paired runs). A variant changes five steps of that sequence and
nothing else:
- base: none;
- early-random: steps 5, 12, 20, 35 and 50 train on the `random` arm of bench_mixing.py (4,096 random
  bytes per file) instead;
- early-shift: the same five steps train on the next learnable arm instead (code -> comments ->
  docstrings -> code): no foreign data, only the arms' batches moved by a step — how much the
  trajectory moves when its order alone changes;
- late-random: the random arm at five steps spread over the last third (2/3, 11/15, 4/5, 13/15
  and 14/15 of the run).
Two more draw every step over the four arms (a quarter each, `random` last) for a while:
- uniform: all along (bench_mixing.py's uniform-paired of case b);
- measured: until the random arm's third loss is known (W = 8 steps after its third step), then
  over the three learnable arms only: what a bandit that must train an arm 3 times to measure it,
  with the proxy's lag, and never explores it again, would do at best.
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
from bench_mixing import LEARNABLE, write_inputs, write_results

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

VARIANTS = ("base", "early-random", "early-shift", "late-random", "measured", "uniform")
EARLY = (5, 12, 20, 35, 50)
LATE_FRACTIONS = (2 / 3, 11 / 15, 4 / 5, 13 / 15, 14 / 15)
#: The proxy's default lag W, and the steps of its own an arm needs to be measured
#: (`reward.WARMUP_PULLS`).
LAG = Policy().lag
MEASURED_PULLS = WARMUP_PULLS


def arm_sequence(variant: str, seed: int, steps: int) -> list[str]:
    """The arm of each step 1..steps (the draw of each step: the bandit's, arms in name order)."""
    order = sorted(LEARNABLE)
    draws = [draw_uniform(seed, 0, s) for s in range(1, steps + 1)]
    if variant in ("measured", "uniform"):
        return measured_sequence(draws, [*order, "random"], steps if variant == "uniform" else 0)
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


def one_run(variant: str, seed: int, args: argparse.Namespace) -> dict:
    """Train one arm sequence; the held-out loss of each learnable arm at the last step."""
    torch.set_num_threads(1)
    specs = [*default_arms(), ArmSpec(name="random", kind="text", paths=["random/*.txt"])]
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
    for step, arm in enumerate(arm_sequence(variant, seed, args.steps), start=1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, optim)
        opt.zero_grad()
        xy = torch.from_numpy(streams[arm].next_batch(args.batch_size))
        _, loss = model(xy[:, :-1], xy[:, 1:])
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
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "andrea-bench-exposure",
    )
    args = p.parse_args()
    if "base" not in args.variants:
        args.variants.insert(0, "base")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="andrea-exposure-") as work:
        args.work_dir = work
        write_inputs(Path(work))
        jobs = [(v, s) for s in args.seeds for v in args.variants]
        runs = []
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(one_run, v, s, args) for v, s in jobs]
            for fut in futures:
                run = fut.result()
                runs.append(run)
                print(
                    f"[{time.perf_counter() - t0:6.0f} s] {run['variant']:12s} seed {run['seed']}: "
                    f"mean {run['mean']:.4f} ({run['seconds']:.0f} s)",
                    flush=True,
                )
    args_out = {k: str(v) for k, v in vars(args).items() if k != "work_dir"}
    doc = {"args": args_out, "seconds": time.perf_counter() - t0, "runs": runs}
    write_results(args.out_dir, "exposure", doc, markdown(runs, args))


if __name__ == "__main__":
    main()
