"""The trainer's step time at another commit against this checkout's: "unchanged within noise".

    .venv/bin/python tests/bench/bench_versions.py --base COMMIT [--rounds 16] [--steps 10]
                                                   [--preset andrea-12m] [--threads 2]

A refactor that touches the loop must leave the step as fast as it was. bench_perf.py compares the
trainer with its bare loop in one checkout; this compares the trainer with itself across commits:
the base commit is checked out in a temporary git worktree and imported instead of this checkout
(its `daemon/`, `control/` and `protocol/` linked as the `andrea` package, first on PYTHONPATH),
with the same interpreter and packages. Rounds alternate the order (base first, then this checkout
first), each a fresh trainer process that trains `--steps` steps after 3 warm-up steps with
checkpoints and samples off, each version with a token cache of its own (the format may differ).
A round's figure is the median of its steps' times (the trainer's own "ms/step", the whole loop
iteration); the result is the mean of the per-round ratios this ÷ base and its standard error.
Not collected by pytest; it needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WARMUP = 3
PACKAGES = ("daemon", "control", "protocol")


def checkout(base: str, work: Path) -> Path:
    """The base commit in a worktree under `work`; the folder to put first on PYTHONPATH."""
    tree = work / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), base],
        check=True,
    )
    path = work / "path"
    (path / "andrea").mkdir(parents=True)
    for name in PACKAGES:
        (path / "andrea" / name).symlink_to(tree / name)
    return path


def step_times(args: argparse.Namespace, env: dict[str, str], cache: Path) -> list[float]:
    """One fresh trainer's per-step seconds after the warm-up."""
    with tempfile.TemporaryDirectory(prefix="andrea-versions-") as run:
        cmd = [
            sys.executable, "-m", "andrea.daemon.trainer.service.cli", "--run-dir", run,
            "--preset", args.preset, "--threads", str(args.threads),
            "--max-steps", str(WARMUP + args.steps), "--checkpoint-every", "0",
            "--sample-every", "0", "--log-every", "1", "--cache-dir", str(cache),
        ]  # fmt: skip
        # cwd outside the checkout: python -m puts the cwd first on sys.path.
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=run)
    if res.returncode != 0:
        raise SystemExit(f"the trainer failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return [
        float(m.group(2)) / 1000
        for m in re.finditer(r"step (\d+)/\d+ .*\| ([\d.]+) ms/step", res.stderr)
        if int(m.group(1)) > WARMUP
    ]


def compare(args: argparse.Namespace, base_path: Path, work: Path) -> dict:
    envs = {
        "base": {**os.environ, "PYTHONPATH": str(base_path)},
        "this": {k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    }
    per: dict[str, list[float]] = {"base": [], "this": []}
    for r in range(args.rounds):
        for version in ("base", "this") if r % 2 == 0 else ("this", "base"):
            per[version].append(statistics.median(step_times(args, envs[version], work / version)))
        print(
            f"round {r + 1}/{args.rounds}: base {per['base'][-1]:.4f} s/step, this "
            f"{per['this'][-1]:.4f} s/step, ratio {per['this'][-1] / per['base'][-1]:.4f}",
            flush=True,
        )
    ratios = [t / b for t, b in zip(per["this"], per["base"])]
    return {
        "base": args.base,
        "preset": args.preset,
        "threads": args.threads,
        "rounds": args.rounds,
        "steps": args.steps,
        "base_median_step_s": statistics.median(per["base"]),
        "this_median_step_s": statistics.median(per["this"]),
        "ratio_mean": statistics.mean(ratios),
        "ratio_standard_error": statistics.stdev(ratios) / len(ratios) ** 0.5,
        "ratio_median": statistics.median(ratios),
        "round_spread": statistics.stdev(ratios),
        "ratios": ratios,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the commit to compare this checkout with")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per trainer, after 3")
    ap.add_argument("--preset", default="andrea-12m")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error("--rounds: at least 2, for a standard error")
    known = ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{args.base}^{{commit}}"]
    if subprocess.run(known, capture_output=True).returncode != 0:
        ap.error(f"--base {args.base!r}: not a commit of this repository")
    with tempfile.TemporaryDirectory(prefix="andrea-versions-") as d:
        work = Path(d)
        try:
            report = compare(args, checkout(args.base, work), work)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "tree")],
                capture_output=True,
                check=False,
            )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
