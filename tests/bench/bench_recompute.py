"""Activation recompute's cost and saving on CPU: the CPU time of a forward and backward pass of
andrea-12m (batch 8 x 256, dropout 0.1, fp32, one thread) with and without `recompute = "blocks"`,
interleaved, and the activation peak torch's memory profiler measures against
`control/sizing.py`'s estimate (docs/performance.md, section 3).

    .venv/bin/python -m tests.bench.bench_recompute [--rounds 5]

CPU time (`time.process_time`), not wall time: the machine may be shared. The first round is
dropped (allocations, thread pools).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from andrea.control.sizing import activation_bytes, cpu_numerics
from andrea.daemon.config import build_config
from andrea.daemon.model import GPT
from tests.unit.test_plan import measured_peak

SETTINGS = ("none", "blocks")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = build_config(overrides={"preset": "andrea-12m"}).model
    models = {}
    for rc in SETTINGS:
        torch.manual_seed(0)
        models[rc] = GPT(base.model_copy(update={"recompute": rc})).train()
    x = torch.randint(0, base.vocab_size, (8, base.block_size + 1))
    seconds: dict[str, list[float]] = {rc: [] for rc in SETTINGS}
    for _ in range(args.rounds):
        for rc in SETTINGS:
            t0 = time.process_time()
            _, loss = models[rc](x[:, :-1], x[:, 1:])
            assert loss is not None
            loss.backward()
            seconds[rc].append(time.process_time() - t0)
            models[rc].zero_grad(set_to_none=True)
    median = {rc: statistics.median(seconds[rc][1:]) for rc in SETTINGS}
    for rc in SETTINGS:
        m = base.model_copy(update={"recompute": rc})
        print(
            f"recompute {rc}: {median[rc]:.3f} CPU s a pass, activation peak "
            f"{measured_peak(m, 8) / 1e6:.1f} MB measured, "
            f"{activation_bytes(m, 8, cpu_numerics(m)) / 1e6:.1f} MB estimated"
        )
    print(f"time ratio {median['blocks'] / median['none']:.3f}")


if __name__ == "__main__":
    main()
