"""Benchmark of `.loss.json`: append cost at entry 1 and at entry N; open, reads and canonical curve at N.

    python tests/bench/bench_losslog.py [--entries 200000] [--out FILE.json] [--dir DIR]

Append cost is the median over many appends around each point (a fresh log for entry 1, a copy of one
N-entry log for entry N, measured alternately so that the load of a shared machine hits both alike), in
three modes: `append` without fsync, 100 x `append` + one `sync`, and `append_many(100)` + one `sync`
(per-entry cost, amortised over the batch). Not collected by pytest (bench_*.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pydantic

from andrea.daemon.rundir.losslog import (
    LossEntry,
    LossLog,
    canonical_curve,
    last_entry,
    read_curve,
    read_entries,
)

BATCH = 100
ARMS = ("stdlib-code", "stdlib-docstrings", "stdlib-comments")


def make_entries(first: int, count: int) -> list[LossEntry]:
    rng = random.Random(first)
    return [
        LossEntry(
            step=s,
            loss=rng.uniform(2.0, 4.0),
            arm=ARMS[s % 3],
            lr=3e-4 * rng.random(),
            tokens=16384,
            wall_time=1_750_000_000.0 + 0.37 * s,
            segment=1,
            phase=0,
            batch_sha256=hashlib.sha256(s.to_bytes(8, "little")).hexdigest(),
        )
        for s in range(first, first + count)
    ]


def per_append_ns(log: LossLog, entries: list[LossEntry]) -> Iterator[float]:
    """Each `append` timed on its own, no fsync."""
    for e in entries:
        t0 = time.perf_counter_ns()
        log.append(e)
        yield time.perf_counter_ns() - t0


def per_entry_with_sync_ns(log: LossLog, entries: list[LossEntry], many: bool) -> Iterator[float]:
    """Batches of BATCH entries, each batch followed by one sync; cost per entry, one value per batch."""
    for i in range(0, len(entries), BATCH):
        batch = entries[i : i + BATCH]
        t0 = time.perf_counter_ns()
        if many:
            log.append_many(batch)
        else:
            for e in batch:
                log.append(e)
        log.sync()
        yield (time.perf_counter_ns() - t0) / len(batch)


def interleaved(first: Iterator[float], second: Iterator[float]) -> tuple[list[float], list[float]]:
    """Alternate the two measurements so that the load of a shared machine hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for x, y in zip(first, second, strict=True):
        a.append(x)
        b.append(y)
    return a, b


def timed(fn: Callable[[], object], repeat: int) -> tuple[dict[str, float], object]:
    """Median and min wall seconds of `fn` over `repeat` runs, and its last result."""
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "runs": repeat}, result


def summary(ns: list[float]) -> dict[str, float]:
    ordered = sorted(ns)
    return {
        "median_us": statistics.median(ordered) / 1e3,
        "p90_us": ordered[int(0.9 * (len(ordered) - 1))] / 1e3,
        "samples": len(ordered),
    }


def fresh_copy(source: Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    with target.open("rb+") as f:
        os.fsync(f.fileno())
    return target


def compare_modes(
    directory: Path, big: Path, big_entries: int, window: int, batches: int
) -> dict[str, dict[str, dict[str, float]]]:
    """Append cost from entry 1 (fresh log) and right after the last entry of `big` (a copy), per mode."""
    modes: dict[str, Callable[[LossLog, list[LossEntry]], Iterator[float]]] = {
        "append, no fsync": per_append_ns,
        f"append x{BATCH} + sync": lambda log, es: per_entry_with_sync_ns(log, es, many=False),
        f"append_many({BATCH}) + sync": lambda log, es: per_entry_with_sync_ns(log, es, many=True),
    }
    results = {}
    for i, (mode, measure) in enumerate(modes.items()):
        count = window if i == 0 else batches * BATCH
        with (
            LossLog.open(directory / f"one-{i}.json") as near,
            LossLog.open(fresh_copy(big, directory / f"far-{i}.json")) as distant,
        ):
            at_one, at_far = interleaved(
                measure(near, make_entries(1, count)),
                measure(distant, make_entries(big_entries + 1, count)),
            )
            assert (
                len(near) == count and len(distant) == big_entries + count
            )  # no append was a no-op
        results[mode] = {
            "at_1": summary(at_one),
            "at_far": summary(at_far),
            "ratio": statistics.median(at_far) / statistics.median(at_one),
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--entries", type=int, default=200_000, help="the far point N (default 200000)"
    )
    parser.add_argument(
        "--window", type=int, default=1000, help="appends timed around each point, no fsync"
    )
    parser.add_argument(
        "--batches", type=int, default=20, help=f"batches of {BATCH} (+ sync) around each point"
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the logs are written (default: system temp)"
    )
    args = parser.parse_args()
    n, window = args.entries, args.window

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-losslog-") as tmp:
        directory = Path(tmp)
        big = directory / "big.json"
        fill_to = n - window // 2  # the timed windows at N are centred on entry N
        with LossLog.open(big) as log:
            for first in range(1, fill_to + 1, 10_000):
                log.append_many(make_entries(first, min(10_000, fill_to + 1 - first)))
        append = compare_modes(directory, big, fill_to, window, args.batches)

        # for open and read: exactly N entries
        with LossLog.open(big) as log:
            log.append_many(make_entries(fill_to + 1, n - fill_to))
        size = big.stat().st_size

        def open_close() -> int:
            log = LossLog.open(big)
            count = len(log)
            log.close()  # its fsync is counted too: nothing was written, so it is cheap
            return count

        open_t, count = timed(open_close, 5)
        read_t, entries = timed(lambda: read_entries(big), 3)
        curve_t, curve = timed(lambda: canonical_curve(entries), 3)
        read_curve_t, columns = timed(lambda: read_curve(big), 3)
        last_t, _ = timed(lambda: last_entry(big), 200)
        assert count == n and len(entries) == n and len(curve) == n and len(columns) == n

    results = {
        "machine": {
            "python": sys.version.split()[0],
            "pydantic": pydantic.VERSION,
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],
            "dir": str(args.dir or tempfile.gettempdir()),
        },
        "entries": n,
        "file_bytes": size,
        "append": append,
        "open": open_t,
        "read_entries": read_t,
        "canonical_curve": curve_t,
        "read_curve": read_curve_t,
        "last_entry": last_t,
    }
    print(
        f"`.loss.json` benchmark, {n:,} entries, {size / 1e6:.1f} MB, Python {results['machine']['python']}, "
        f"pydantic {pydantic.VERSION}, {os.cpu_count()} CPUs, {results['machine']['dir']}\n"
    )
    print(f"| append mode (per entry, median) | at entry 1 | at entry {n:,} | ratio |")
    print("|---|---:|---:|---:|")
    for mode, r in append.items():
        print(
            f"| {mode} | {r['at_1']['median_us']:.1f} µs | {r['at_far']['median_us']:.1f} µs | {r['ratio']:.2f}× |"
        )
    print(f"\n| at {n:,} entries (median of runs; min) | time |\n|---|---:|")
    for label, t, unit, scale in [
        ("`LossLog.open` (index + checks)", open_t, "ms", 1e3),
        ("`read_entries` (all as LossEntry)", read_t, "ms", 1e3),
        ("`canonical_curve`", curve_t, "ms", 1e3),
        ("`read_curve` (canonical curve as columns)", read_curve_t, "ms", 1e3),
        ("`last_entry`", last_t, "µs", 1e6),
    ]:
        print(f"| {label} | {t['median_s'] * scale:.0f} {unit} (min {t['min_s'] * scale:.0f}) |")
    print(f"\n1-minute load average during the run: {results['machine']['load_average_1min']:.2f}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
