"""What data parallelism costs and gives on this machine, measured in one run.

    .venv/bin/python tests/bench/bench_distributed.py [--preset andrea-tiny] [--batch 16]
        [--steps 120] [--repeats 3] [--out FILE]

Three kinds of job train the same global batch (`batch_size` is per step over the whole job) of the
same preset with one intra-op thread per process, checkpoints and samples off:

- `1 rank`: a plain `andrea-trainer` process;
- `2 ranks`: `torchrun --standalone --nproc-per-node 2` (DDP over gloo), as shipped;
- `2 ranks, no agreement`: the same job with the per-step agreement collective switched off (a
  hidden benchmark flag; such a job cannot stop all ranks at one step on a signal).

Kinds are interleaved round by round (A B C, A B C, ...) so that a load change on a shared machine
hits all alike. Each job's time per step is the median gap between consecutive steps' wall times in
its .loss.json, after a warm-up of 10 steps; tokens/s = global batch x block / that time. Reported:
the agreement's per-step cost (2 ranks / 2 ranks without it) and 2-rank throughput against 1 rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
WARMUP = 10


def trainer_args(run_dir: str, cache: str, preset: str, batch: int, steps: int) -> list[str]:
    return [
        "--run-dir",
        run_dir,
        "--preset",
        preset,
        "--threads",
        "1",
        "--batch-size",
        str(batch),
        "--max-steps",
        str(steps),
        "--checkpoint-every",
        "0",
        "--sample-every",
        "0",
        "--log-every",
        "1000",
        "--cache-dir",
        cache,
    ]


def run_job(kind: str, cache: str, preset: str, batch: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="andrea-bench-ddp-") as d:
        args = trainer_args(d, cache, preset, batch, steps)
        if kind == "1 rank":
            cmd = [str(BIN / "andrea-trainer"), *args]
        else:
            cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
            cmd += ["--no-python", str(BIN / "andrea-trainer"), *args]
            if kind == "2 ranks, no agreement":
                cmd.append("--unsafe-no-coordination")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{kind} failed ({res.returncode}):\n{res.stderr[-4000:]}")
        entries = json.loads((Path(d) / ".loss.json").read_text())
    times = [e["wall_time"] for e in sorted(entries, key=lambda e: e["step"])]
    gaps = [b - a for a, b in zip(times[WARMUP:], times[WARMUP + 1 :])]
    per_step = statistics.median(gaps)
    tokens = entries[-1]["tokens"]
    return {"kind": kind, "ms_per_step": 1000 * per_step, "tok_s": tokens / per_step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="andrea-tiny")
    p.add_argument("--batch", type=int, default=16, help="global batch (sequences per step)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache-dir", default=os.environ.get("ANDREA_TEST_CACHE"))
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    cache = a.cache_dir or tempfile.mkdtemp(prefix="andrea-bench-cache-")
    kinds = ["1 rank", "2 ranks", "2 ranks, no agreement"]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(a.repeats):
        for k in kinds:
            res = run_job(k, cache, a.preset, a.batch, a.steps)
            results[k].append(res)
            print(
                f"[round {r + 1}] {k}: {res['ms_per_step']:.2f} ms/step, {res['tok_s']:.0f} tok/s",
                flush=True,
            )
    med = {k: statistics.median(x["ms_per_step"] for x in v) for k, v in results.items()}
    tok = {k: statistics.median(x["tok_s"] for x in v) for k, v in results.items()}
    lines = [
        f"{a.preset}, global batch {a.batch}, 1 thread per process, {a.steps} steps per job, "
        f"median of {a.repeats} interleaved rounds (load average at the end: {os.getloadavg()[0]:.1f})",
        "",
        "| job | ms/step | tokens/s |",
        "|---|---:|---:|",
        *[f"| {k} | {med[k]:.2f} | {tok[k]:.0f} |" for k in kinds],
        "",
        f"- per-step cost of the agreement collective: 2 ranks / 2 ranks without it = "
        f"{med['2 ranks'] / med['2 ranks, no agreement']:.3f}x "
        f"({med['2 ranks'] - med['2 ranks, no agreement']:+.2f} ms/step)",
        f"- 2-rank throughput against 1 rank: {tok['2 ranks'] / tok['1 rank']:.2f}x",
    ]
    text = "\n".join(lines)
    print("\n" + text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
