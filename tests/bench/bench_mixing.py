"""Mixing quality: the proxy's bandit against a uniform and a natural-proportion fixed mixture.

    .venv/bin/python tests/bench/bench_mixing.py [--steps 1000] [--seeds 1 2 3] [--eval-every 50]
        [--eval-sequences 128] [--threads 1] [--policy FILE] [--out-dir DIR]

Each run is a real `andrea-trainer` at andrea-tiny on the embedded corpus (5% of each arm's
modules held out), in a fresh run directory:
- bandit:  `--with-proxy` (the proxy's ODM bandit, under `--policy` if given);
- uniform: `--mixing fixed`, every arm weight 1;
- natural: `--mixing fixed`, each arm weighted by its training tokens (what concatenating the
  sources and sampling uniformly would give).
Runs are interleaved (seed 1: bandit, uniform, natural; seed 2: uniform, natural, bandit; ...) so
that a change of machine load touches every mixture alike. The LR schedule is shortened to end at
`--steps` (optim.decay_steps), so every run finishes its cosine decay.

Read from each run's `.eval.json`: each arm's held-out loss every `--eval-every` steps. Reported:
the mean over arms and the worst arm at equal steps (mean ± standard deviation over seeds), and the
steps each mixture needs to reach the uniform mixture's final mean held-out loss (on the
seed-averaged curve, linearly interpolated between evaluations) — the online-data-mixing paper's
"fewer iterations" figure — as a ratio to uniform's. Writes `mixing.json` and `mixing.md` to
`--out-dir` (default `$TMPDIR/andrea-bench-mixing`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from andrea.daemon.config import DataConfig, default_arms
from andrea.daemon.data import load_arms
from andrea.daemon.evallog import canonical_evals, read_evals
from andrea.daemon.heldout import DEFAULT_FRACTION
from andrea.daemon.losslog import canonical_curve, read_entries

MIXTURES = ("bandit", "uniform", "natural")


def natural_weights() -> dict[str, float]:
    arms = load_arms(DataConfig(heldout_fraction=DEFAULT_FRACTION), Path("."), 256)
    return {a.name: float(a.n_tokens) for a in arms}


def run_config(mixture: str, seed: int, args: argparse.Namespace, natural: dict) -> dict:
    arms = []
    for spec in default_arms():
        weight = natural[spec.name] if mixture == "natural" else 1.0
        arms.append({"name": spec.name, "kind": "stdlib", "part": spec.part, "weight": weight})
    return {
        "preset": "andrea-tiny",
        "seed": seed,
        "max_steps": args.steps,
        "threads": args.threads,
        "sample_every": 0,
        "log_every": 100,
        "mixing": "proxy" if mixture == "bandit" else "fixed",
        "optim": {"decay_steps": args.steps},
        "checkpoint": {"every": 0},
        "eval": {"every": args.eval_every, "sequences": args.eval_sequences},
        "data": {"arms": arms, "heldout_fraction": DEFAULT_FRACTION},
    }


def one_run(mixture: str, seed: int, args: argparse.Namespace, natural: dict) -> dict:
    run_dir = Path(args.work_dir) / f"{mixture}-seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "run.toml").write_text(tomli_w.dumps(run_config(mixture, seed, args, natural)))
    cmd = [sys.executable, "-m", "andrea.daemon.trainer_cli", "--run-dir", str(run_dir)]
    if mixture == "bandit":
        cmd.append("--with-proxy")
        if args.policy:
            cmd += ["--policy", str(args.policy)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{mixture} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    evals = canonical_evals(read_evals(run_dir / ".eval.json"))
    losses = canonical_curve(read_entries(run_dir / ".loss.json"))
    pulls: dict[str, int] = {}
    for e in losses:
        pulls[e.arm] = pulls.get(e.arm, 0) + 1
    return {
        "mixture": mixture,
        "seed": seed,
        "seconds": seconds,
        "steps": len(losses),
        "pulls": dict(sorted(pulls.items())),
        "evals": {e.step: {n: a.loss for n, a in e.arms.items()} for e in evals},
    }


def steps_to_reach(curve: list[tuple[int, float]], target: float) -> float | None:
    """First step at which the curve reaches `target`, interpolated between evaluations."""
    prev = None
    for step, value in curve:
        if value <= target:
            if prev is None:
                return float(step)
            (s0, v0) = prev
            return s0 + (step - s0) * (v0 - target) / (v0 - value)
        prev = (step, value)
    return None


def summarise(runs: list[dict], steps: int) -> dict:
    by_mix: dict[str, list[dict]] = {m: [r for r in runs if r["mixture"] == m] for m in MIXTURES}
    by_mix = {m: rs for m, rs in by_mix.items() if rs}
    out: dict = {"mixtures": {}}
    for m, rs in by_mix.items():
        final = [r["evals"][steps] for r in rs]
        means = [statistics.fmean(f.values()) for f in final]
        worsts = [max(f.values()) for f in final]
        arm_names = sorted(final[0])
        eval_steps = sorted(set.intersection(*(set(r["evals"]) for r in rs)))
        curve = [
            (s, statistics.fmean(statistics.fmean(r["evals"][s].values()) for r in rs))
            for s in eval_steps
        ]
        out["mixtures"][m] = {
            "seeds": [r["seed"] for r in rs],
            "final_mean": statistics.fmean(means),
            "final_mean_sd": statistics.stdev(means) if len(means) > 1 else 0.0,
            "final_worst": statistics.fmean(worsts),
            "final_worst_sd": statistics.stdev(worsts) if len(worsts) > 1 else 0.0,
            "worst_arm": max(arm_names, key=lambda a: statistics.fmean(f[a] for f in final)),
            "per_arm": {a: statistics.fmean(f[a] for f in final) for a in arm_names},
            "per_seed_mean": means,
            "curve": curve,
            "pull_share": {
                a: statistics.fmean(r["pulls"].get(a, 0) / r["steps"] for r in rs)
                for a in arm_names
            },
            "seconds": statistics.fmean(r["seconds"] for r in rs),
        }
    if "uniform" in out["mixtures"]:
        target = out["mixtures"]["uniform"]["final_mean"]
        out["target"] = target
        base = steps_to_reach(out["mixtures"]["uniform"]["curve"], target)
        for s in out["mixtures"].values():
            reached = steps_to_reach(s["curve"], target)
            s["steps_to_target"] = reached
            s["ratio_to_uniform"] = reached / base if reached is not None and base else None
    return out


def markdown(summary: dict, args: argparse.Namespace) -> str:
    lines = [
        f"andrea-tiny, {args.steps} steps, seeds {' '.join(map(str, args.seeds))}, held-out loss "
        f"(nats/token) on {args.eval_sequences} sequences per arm, evaluated every {args.eval_every} steps.",
        "",
        "| mixture | mean over arms at step "
        f"{args.steps} | worst arm at step {args.steps} | steps to uniform's final mean | "
        "ratio to uniform | share of steps per arm |",
        "|---|---|---|---|---|---|",
    ]
    for m, s in summary["mixtures"].items():
        reached = s.get("steps_to_target")
        ratio = s.get("ratio_to_uniform")
        share = ", ".join(f"{a} {v:.2f}" for a, v in s["pull_share"].items())
        lines.append(
            f"| {m} | {s['final_mean']:.4f} ± {s['final_mean_sd']:.4f} | "
            f"{s['final_worst']:.4f} ± {s['final_worst_sd']:.4f} ({s['worst_arm']}) | "
            f"{'not reached' if reached is None else f'{reached:.0f}'} | "
            f"{'—' if ratio is None else f'{ratio:.3f}'} | {share} |"
        )
    lines += ["", "Per arm at the last step (mean over seeds):", ""]
    for m, s in summary["mixtures"].items():
        lines.append(f"- {m}: " + ", ".join(f"{a} {v:.4f}" for a, v in s["per_arm"].items()))
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--mixtures", nargs="+", choices=MIXTURES, default=list(MIXTURES))
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-sequences", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--policy", type=Path, help="the bandit's policy TOML (default: built-in)")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "andrea-bench-mixing",
    )
    args = p.parse_args()
    if args.steps % args.eval_every:
        p.error("--steps must be a multiple of --eval-every")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    natural = natural_weights()
    runs = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="andrea-mixing-") as work:
        args.work_dir = work
        for i, seed in enumerate(args.seeds):
            k = i % len(args.mixtures)
            for mixture in args.mixtures[k:] + args.mixtures[:k]:
                run = one_run(mixture, seed, args, natural)
                runs.append(run)
                final = run["evals"][args.steps]
                print(
                    f"[{time.perf_counter() - t0:6.0f} s] {mixture:8s} seed {seed}: mean "
                    f"{statistics.fmean(final.values()):.4f}, worst {max(final.values()):.4f} "
                    f"({run['seconds']:.0f} s, pulls {run['pulls']})",
                    flush=True,
                )
    summary = summarise(runs, args.steps)
    summary["args"] = {k: str(v) for k, v in vars(args).items() if k != "work_dir"}
    summary["natural_weights"] = natural
    summary["runs"] = runs
    (args.out_dir / "mixing.json").write_text(json.dumps(summary, indent=1))
    text = markdown(summary, args)
    (args.out_dir / "mixing.md").write_text(text)
    print(text)
    print(f"total {time.perf_counter() - t0:.0f} s; results in {args.out_dir}")


if __name__ == "__main__":
    main()
