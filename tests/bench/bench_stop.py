"""Trainer figures for the operator: training throughput, SIGTERM-to-exit time, checkpoint write time.

    .venv/bin/python tests/bench/bench_stop.py [--presets andrea-tiny andrea-12m] [--rounds 3] [--out FILE]

For each preset, each round starts a real trainer in a fresh run directory, lets it train a few
steps, sends SIGTERM at a random moment inside a step, and measures the time until the process has
exited (the step in flight, the final checkpoint, the exit). Throughput is read from the trainer's
own progress lines; the write time from its checkpoint line. SIGTERM-to-exit is also reported as a
ratio against its budget (one step + one checkpoint write + 0.5 s) measured in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS_BEFORE_STOP = {"andrea-tiny": 30, "andrea-12m": 4, "andrea-120m": 2}


def one_round(preset: str, cache: str, rng: random.Random) -> dict:
    with tempfile.TemporaryDirectory(prefix="andrea-bench-") as d:
        cmd = [
            sys.executable,
            "-m",
            "andrea.daemon.trainer.service.cli",
            "--run-dir",
            d,
            "--preset",
            preset,
            "--max-steps",
            "1000000",
            "--checkpoint-every",
            "0",
            "--sample-every",
            "0",
            "--log-every",
            "1",
            "--cache-dir",
            cache,
        ]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        step_ms: list[float] = []
        tok_s: list[float] = []
        want = STEPS_BEFORE_STOP.get(preset, 3)
        for line in proc.stderr:
            if m := re.search(r"step (\d+)/\d+ .*\| (\d+) tok/s \| ([\d.]+) ms/step", line):
                if int(m.group(1)) > 1:  # the first step pays for warm-up
                    tok_s.append(float(m.group(2)))
                    step_ms.append(float(m.group(3)))
                if int(m.group(1)) >= want:
                    break
        time.sleep(rng.uniform(0, statistics.median(step_ms) / 1000))
        t0 = time.perf_counter()
        os.kill(proc.pid, signal.SIGTERM)
        rest = proc.stderr.read()
        code = proc.wait()
        exit_s = time.perf_counter() - t0
        m = re.search(r"written \(sigterm, ([\d.]+) MB, ([\d.]+) s\)", rest)
        if code != 0 or not m:
            raise RuntimeError(f"{preset}: trainer exited {code}:\n{rest}")
        write_s = float(m.group(2))
        budget = statistics.median(step_ms) / 1000 + write_s + 0.5
        return {
            "tokens_per_s": statistics.median(tok_s),
            "step_s": statistics.median(step_ms) / 1000,
            "checkpoint_mb": float(m.group(1)),
            "checkpoint_write_s": write_s,
            "sigterm_to_exit_s": exit_s,
            "budget_s": budget,
            "exit_over_budget": exit_s / budget,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["andrea-tiny", "andrea-12m"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/andrea"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rng = random.Random(0)
    report = {"threads": os.cpu_count(), "presets": {}}
    for preset in args.presets:
        rounds = []
        for i in range(args.rounds):
            r = one_round(preset, args.cache_dir, rng)
            print(
                f"{preset} round {i + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in r.items()),
                flush=True,
            )
            rounds.append(r)
        report["presets"][preset] = {
            k: statistics.median(r[k] for r in rounds) for k in rounds[0]
        } | {"rounds": rounds}
    print("\n| preset | tokens/s | s/step | checkpoint MB | write s | SIGTERM→exit s | ÷ budget |")
    print("|---|---|---|---|---|---|---|")
    for p, r in report["presets"].items():
        print(
            f"| {p} | {r['tokens_per_s']:.0f} | {r['step_s']:.3f} | {r['checkpoint_mb']:.1f} | "
            f"{r['checkpoint_write_s']:.3f} | {r['sigterm_to_exit_s']:.2f} | {r['exit_over_budget']:.2f} |"
        )
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
