"""FSDP against DDP at one preset, through the trainer's own strategies (daemon/trainer/parallel/).

    .venv/bin/torchrun --standalone --nproc-per-node 2 tests/bench/bench_fsdp.py \
        [--preset andrea-120m] [--steps 3] [--batch 2] [--seq 128]

Per strategy, in the same job one after the other (gloo on CPU, one thread per rank): a few
training steps of `--batch` sequences of `--seq` tokens per rank, then one checkpoint's gather as
the trainer does it (FSDP: the streamed all-gathers into rank 0's staging buffer; DDP: the
replicas' check and rank 0's copy into it). Printed by rank 0, per rank where it differs:

- the bytes each rank holds of parameters, gradients and Adam's m and v;
- tokens/s of the job (every rank's tokens over the wall time of the steps);
- the checkpoint stall: the gather (training waits for it; the write runs in the background);
- rank 0's peak extra host memory during it: the rise of its peak resident memory (VmHWM, reset
  before the gather through /proc/self/clear_refs) above what it held before, the staging buffer
  (allocated and touched at start, as the trainer does) not counted.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from andrea.daemon.checkpoint.manager import layout_of
from andrea.daemon.checkpoint.writer import StagingBuffer
from andrea.daemon.config import build_config
from andrea.daemon.model import GPT
from andrea.daemon.trainer.parallel import STRATEGIES
from andrea.daemon.trainer.parts import adamw
from andrea.daemon.trainer.platform.precision import FP32
from andrea.daemon.trainer.platform.world import World


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def measure(name: str, preset: str, steps: int, batch: int, seq: int) -> dict[str, float]:
    world = World.from_environ()
    cfg = build_config({}, {"preset": preset})
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(cfg.model)
    n = model.n_params()
    layout = layout_of((k, tuple(p.shape)) for k, p in model.named_parameters())
    staging = StagingBuffer(n) if world.is_main else None
    strategy = STRATEGIES[name](world, cpu, FP32)
    wrapped = strategy.wrap(model, adamw(model, cfg.optim), False, lambda m: adamw(m, cfg.optim))
    opt, params = wrapped.optimizer, wrapped.params
    g = torch.Generator().manual_seed(world.rank)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        xy = torch.randint(0, cfg.model.vocab_size, (batch, seq + 1), generator=g)
        opt.zero_grad()
        with strategy.sync(True):
            _, loss = wrapped.forward(xy[:, :-1], xy[:, 1:])
            loss.backward()
        strategy.clip(params, 1.0)
        opt.step()
    dist.barrier()
    seconds = time.perf_counter() - t0
    out = {
        "params": _local_bytes(params),
        "grads": _local_bytes([p.grad for p in params if p.grad is not None]),
        "optimizer": _local_bytes([t for p in params for t in opt.state[p].values()]),
        "tokens_s": steps * batch * seq * world.size / seconds,
    }
    states = [opt.state[p] for p in params]
    moments = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states])
    gc.collect()
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    staged = strategy.gather(params, moments, [e.offset for e in layout], staging, steps)
    if staging is not None and not staged:
        staging.fill(steps, params, *moments)
    out["stall_s"] = time.perf_counter() - t0
    out["peak_extra"] = (_status_kb("VmHWM") - before) * 1024
    dist.barrier()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="andrea-120m")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results = {}
    for name in ("ddp", "fsdp"):
        r = measure(name, args.preset, args.steps, args.batch, args.seq)
        gathered: list[dict[str, float] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, r)
        results[name] = gathered
        gc.collect()
    if rank == 0:
        load = os.getloadavg()[0]
        print(f"{args.preset}, {dist.get_world_size()} ranks (gloo, CPU, 1 thread each), "
              f"{args.steps} steps of {args.batch} x {args.seq} tokens per rank; "
              f"load average {load:.1f}")  # fmt: skip
        print("| | DDP | FSDP |\n|---|---:|---:|")
        for key, label, scale in (
            ("params", "parameters, MB per rank", 1e6),
            ("grads", "gradients, MB per rank", 1e6),
            ("optimizer", "Adam m, v (+ step), MB per rank", 1e6),
            ("tokens_s", "tokens/s (job)", 1),
            ("stall_s", "checkpoint stall (gather), s, rank 0", 1),
            ("peak_extra", "rank 0 peak extra host memory in the gather, MB", 1e6),
        ):
            cells = []
            for name in ("ddp", "fsdp"):
                per = [g[key] / scale for g in results[name] if g is not None]
                shown = per[:1] if key in ("tokens_s", "stall_s", "peak_extra") else per
                cells.append(" / ".join(f"{x:,.1f}" for x in shown))
            print(f"| {label} | {cells[0]} | {cells[1]} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
