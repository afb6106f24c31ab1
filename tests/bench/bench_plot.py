"""Benchmark of the audit plot (`andreactl plot`) at 200,000 entries. Not collected by pytest.

    .venv/bin/python tests/bench/bench_plot.py [--entries 200000] [--repeat 5] [--out FILE.json]

A synthetic run: a noisy decaying loss with spikes and a few non-finite losses, three arms, a restart
that re-trains 500 steps (a second segment), a pivot to a capped policy at 60% of the run, audit
checkpoints and a zombie arm. Measured, median of ``--repeat`` alternated runs in this process:

- ``render_png_s`` / ``render_svg_s``: :func:`audit_figure` + :func:`save_figure` from the curve in
  memory (the target: under 2 s);
- ``baseline_s``: the same-sized figure with a single 4,000-point line saved as PNG, matplotlib's fixed
  cost on this machine; ``render_png_s / baseline_s`` is the ratio that stays comparable across
  machines and loads;
- ``read_curve_s``: reading the 200,000-entry ``.loss.json`` (what the command adds before drawing);
- ``command_s``: the whole ``andreactl plot --out x.png`` in a fresh process, once (imports included);
- ``tensorboard_export_s``: ``andreactl metrics export --format tensorboard``'s work on the curve, once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from andrea.control.plot import audit_figure, save_figure
from andrea.control.run_events import PhaseSpan, Pivot, RunEvents, Zombie, restarts
from andrea.daemon.metrics.tensorboard import export_tensorboard
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.rundir.losslog import LossLog, read_curve
from andrea.protocol.lossentry import LossEntry

ARMS = ("docstrings", "code", "comments")


def synthetic_entries(n: int, seed: int = 7) -> list[LossEntry]:
    rng = np.random.default_rng(seed)
    restart_from, redo = n // 3, 500
    pivot = int(n * 0.6)
    steps = list(range(1, restart_from + redo + 1)) + list(range(restart_from + 1, n + 1))
    segments = [1] * (restart_from + redo) + [2] * (n - restart_from)
    loss = 2.0 + 3.0 * np.exp(-np.arange(n + 1) / (n / 8)) + rng.normal(0, 0.08, n + 1)
    loss[rng.choice(n, 12, replace=False)] += rng.uniform(2, 30, 12)  # spikes
    out = []
    for i, (s, seg) in enumerate(zip(steps, segments)):
        value = float(loss[s]) if i % 50_000 != 49_999 else float("nan")
        arm = ARMS[int(rng.integers(0, 3 if s <= pivot else 2))]
        out.append(
            LossEntry(
                step=s,
                loss=value,
                arm=arm,
                lr=3e-4 * min(1.0, s / 2000) * (0.1 + 0.9 * (1 - s / n)),
                tokens=16384,
                wall_time=1.75e9 + 0.37 * i,
                segment=seg,
                phase=int(s > pivot),
                batch_sha256=hashlib.sha256(s.to_bytes(8, "little")).hexdigest(),
            )
        )
    return out


def events_for(curve, n: int) -> RunEvents:
    pivot = int(n * 0.6)
    capped = Policy(arms={"code": {"floor": 0.2, "cap": 0.6}, "docstrings": {"floor": 0.3}})
    return RunEvents(
        restarts=restarts(curve),
        pivots=[Pivot(pivot, 1, capped.fingerprint())],
        phases=[PhaseSpan(0, 1, pivot, Policy()), PhaseSpan(1, pivot + 1, n, capped)],
        audit_checkpoints=[(s, "sigusr1") for s in range(n // 10, n, n // 10)],
        zombies=[Zombie(pivot + 1, "comments", "source not configured")],
    )


def baseline(out: Path) -> None:
    fig = Figure(figsize=(12, 8.7), layout="constrained")
    ax = fig.subplots()
    ax.plot(np.arange(4000), np.random.default_rng(0).normal(size=4000))
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = work / "run"
        run.mkdir()
        with LossLog.open(run / ".loss.json") as log:
            log.append_many(synthetic_entries(args.entries))
        t0 = time.perf_counter()
        curve = read_curve(run / ".loss.json")
        read_s = time.perf_counter() - t0
        events = events_for(curve, args.entries)
        times: dict[str, list[float]] = {"render_png_s": [], "render_svg_s": [], "baseline_s": []}
        baseline(work / "warm.png")  # font cache and backend import outside the timings
        for _ in range(args.repeat):
            for key in times:
                t0 = time.perf_counter()
                if key == "baseline_s":
                    baseline(work / "base.png")
                else:
                    fig = audit_figure(curve, events, title="bench")
                    save_figure(fig, work / ("p.png" if key == "render_png_s" else "p.svg"))
                times[key].append(time.perf_counter() - t0)
        ctl = Path(sys.executable).with_name("andreactl")
        t0 = time.perf_counter()
        subprocess.run(
            [str(ctl), "plot", "--run-dir", str(run), "--out", str(work / "c.png")], check=True
        )
        command_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        export_tensorboard(curve, work / "tb")
        tensorboard_s = time.perf_counter() - t0
        png_kb = (work / "p.png").stat().st_size / 1024
    res = {name: statistics.median(v) for name, v in times.items()}
    res |= {
        "entries": args.entries,
        "steps": len(curve),
        "read_curve_s": read_s,
        "command_s": command_s,
        "tensorboard_export_s": tensorboard_s,
        "png_kib": round(png_kb, 1),
        "ratio_png_to_baseline": res["render_png_s"] / res["baseline_s"],
        "all_s": times,
    }
    print(json.dumps(res, indent=1))
    print(
        f"\nrender at {len(curve):,} steps: PNG {res['render_png_s']:.3f} s, SVG {res['render_svg_s']:.3f} s "
        f"(target < 2 s; {res['ratio_png_to_baseline']:.2f} x a one-line figure, {res['baseline_s']:.3f} s); "
        f"read_curve {read_s:.3f} s; whole `andreactl plot` {command_s:.2f} s; TensorBoard export {tensorboard_s:.1f} s",
        file=sys.stderr,
    )
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
