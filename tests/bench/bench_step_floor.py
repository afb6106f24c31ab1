"""The per-step floor of `andreactl plan`: what a step of the trainer's model costs on the host
whatever the GPU, its eager operator dispatch (forward, backward, gradient clipping, AdamW), measured
with the tensors shrunk to nothing so that no arithmetic is left to time.

    nice -n 5 .venv/bin/python tests/bench/bench_step_floor.py [--steps 200] [--layers 2 6]

For each layer count: a GPT of that depth, width 8 (2 heads), 8 tokens a sequence, one sequence a
step, one thread, the run's AdamW (`parts.adamw`) and the trainer's clipping; the CPU time of the
calling thread per step (not wall time: the machine may be shared, and other processes' load must
not count), the median of the fastest tenth of --steps timed steps after 20 warm-up steps. The floor is fitted as base + per_layer x n_layer (two layer
counts), the figures `control/planning.py` uses (STEP_FLOOR_BASE_S, STEP_FLOOR_PER_LAYER_S). On a
GPU each of these operators also launches a kernel, so the host's share is a lower bound of the
step there; a model large enough for its arithmetic to take longer is not floored at all.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from andrea.daemon.config import ModelConfig, OptimConfig
from andrea.daemon.model import GPT
from andrea.daemon.trainer.parts import adamw


def step_seconds(n_layer: int, steps: int) -> float:
    torch.manual_seed(0)
    model = GPT(ModelConfig(block_size=8, n_layer=n_layer, n_head=2, n_embd=8, vocab_size=256))
    opt = adamw(model, OptimConfig())
    x = torch.randint(0, 256, (1, 9))
    times = []
    for i in range(steps + 20):
        start = time.thread_time()
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if i >= 20:
            times.append(time.thread_time() - start)
    # The quickest steps: caches and frequency scaling under other load only ever add time.
    return statistics.median(sorted(times)[: max(1, len(times) // 10)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--layers", type=int, nargs=2, default=[2, 6])
    args = ap.parse_args()
    torch.set_num_threads(1)
    (a, b) = args.layers
    ta, tb = step_seconds(a, args.steps), step_seconds(b, args.steps)
    per_layer = (tb - ta) / (b - a)
    base = ta - per_layer * a
    print(f"n_layer {a}: {ta * 1000:.2f} ms/step; n_layer {b}: {tb * 1000:.2f} ms/step")
    print(f"floor = {base * 1000:.2f} ms + {per_layer * 1000:.3f} ms x n_layer")


if __name__ == "__main__":
    main()
