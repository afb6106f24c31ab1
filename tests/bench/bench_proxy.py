"""What the proxy link costs a training step: proxy mixing vs fixed mixing, same run, interleaved.

    .venv/bin/python tests/bench/bench_proxy.py [--preset andrea-tiny] [--steps 300] [--rounds 5] [--out FILE]

Each round trains the same preset for the same number of steps twice in fresh run directories —
once with `--mixing fixed`, once with `--with-proxy` — alternating which goes first. The figure is
the median step time after warm-up, read from the trainer's own progress lines; the ratio
proxy/fixed is the link's per-step overhead (the arms differ between the modes, which does not
change the cost of a step: every batch has the same shape).
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


def step_ms(preset: str, steps: int, mode: str, cache: str) -> float:
    with tempfile.TemporaryDirectory(prefix="andrea-bench-") as d:
        extra = ["--with-proxy"] if mode == "proxy" else ["--mixing", "fixed"]
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "andrea.daemon.trainer.service.cli",
                "--run-dir",
                d,
                "--preset",
                preset,
                "--max-steps",
                str(steps),
                "--checkpoint-every",
                "0",
                "--sample-every",
                "0",
                "--log-every",
                "10",
                "--cache-dir",
                cache,
                *extra,
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        ms = [float(x) for x in re.findall(r"\| ([\d.]+) ms/step", res.stderr)]
        return statistics.median(ms[1:])  # the first window pays for warm-up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="andrea-tiny")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/andrea"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    fixed, proxy = [], []
    for i in range(args.rounds):
        order = ("fixed", "proxy") if i % 2 == 0 else ("proxy", "fixed")
        for mode in order:
            (fixed if mode == "fixed" else proxy).append(
                step_ms(args.preset, args.steps, mode, args.cache_dir)
            )
        print(
            f"round {i + 1}: fixed {fixed[-1]:.2f} ms/step, proxy {proxy[-1]:.2f} ms/step",
            flush=True,
        )
    f, p = statistics.median(fixed), statistics.median(proxy)
    print(
        f"\n| preset | fixed ms/step | proxy ms/step | proxy ÷ fixed |\n|---|---|---|---|\n| {args.preset} | {f:.2f} | {p:.2f} | {p / f:.3f} |"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"preset": args.preset, "fixed_ms": fixed, "proxy_ms": proxy, "ratio": p / f},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
