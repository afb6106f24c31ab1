"""Operator-facing latencies under a real systemd (booted privately, as tests/process/test_systemd.py does).

    .venv/bin/python tests/bench/bench_systemd.py [--presets andrea-tiny andrea-12m] [--rounds 2]

Needs root, unshare and systemd. For each preset, in a fresh run: `systemctl start andrea@RUN.target`
to active on a first start (tokenized-data cache cold for the first preset, warm after), `systemctl
reload andrea-trainer@RUN` (a synchronous checkpoint), and `systemctl stop` of both daemons (the
command returns once both have exited: the trainer's step in flight and its final checkpoint); then
the same start again as a restart (resume from that checkpoint). Prints a Markdown table; each figure
is the median of the rounds, wall-clock on this machine as loaded as it is.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))

from realsystemd import SystemdMachine, unavailable  # noqa: E402

STEPS_BEFORE = {"andrea-tiny": 30, "andrea-12m": 3, "andrea-120m": 2}


def timed(m: SystemdMachine, cmd: str) -> float:
    t0 = time.monotonic()
    m.sh(cmd, timeout=1800, check=True)
    return time.monotonic() - t0


def step(m: SystemdMachine, run: str) -> int:
    text = m.prop(f"andrea-trainer@{run}.service", "StatusText")
    return int(text.split()[1].split("/")[0]) if text.startswith("step ") else -1


def one_run(m: SystemdMachine, run: str, preset: str) -> dict[str, float]:
    m.path(f"/etc/andrea/{run}.env").write_text(
        f'ANDREA_TRAINER_ARGS="--preset {preset} --max-steps 100000 --checkpoint-every 0'
        ' --log-every 1 --sample-every 0"\n'
    )
    units = f"andrea-trainer@{run}.service andrea-proxy@{run}.service"
    out = {"first start": timed(m, f"systemctl start andrea@{run}.target")}
    m.wait_until(lambda: step(m, run) >= STEPS_BEFORE[preset], 1800, "training")
    out["reload"] = timed(m, f"systemctl reload andrea-trainer@{run}.service")
    out["stop"] = timed(m, f"systemctl stop andrea@{run}.target {units}")
    out["restart start"] = timed(m, f"systemctl start andrea@{run}.target")
    m.sh(f"systemctl stop andrea@{run}.target {units}", timeout=1800, check=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["andrea-tiny", "andrea-12m"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if why := unavailable():
        sys.exit(f"bench_systemd: {why}")
    with tempfile.TemporaryDirectory(prefix="andrea-bench-systemd-") as scratch:
        m = SystemdMachine(Path(scratch))
        m.boot()
        try:
            rows = {}
            for preset in args.presets:
                rounds = [one_run(m, f"b{i}{preset[-3:]}", preset) for i in range(args.rounds)]
                rows[preset] = rounds
                print(f"{preset}: {rounds}", file=sys.stderr)
        finally:
            m.kill()
    keys = ["first start", "reload", "stop", "restart start"]
    print("| preset | " + " | ".join(f"{k} (s)" for k in keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for preset, rounds in rows.items():
        cells = []
        for k in keys:
            values = [r[k] for r in rounds]
            cells.append(f"{statistics.median(values):.1f}")
        print(f"| {preset} | " + " | ".join(cells) + " |")
    first = rows[args.presets[0]][0]["first start"]
    print(
        f"\nfirst start with a cold tokenized-data cache ({args.presets[0]}, round 1): {first:.1f} s"
    )


if __name__ == "__main__":
    main()
