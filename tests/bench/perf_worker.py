"""One measurement in a fresh process, for bench_perf.py (which interleaves them).

    python tests/bench/perf_worker.py throughput --model ref|ours|plain [--preset andrea-12m] [--threads 2]
                                      [--steps 6] [--warmup 2] [--dropout X] [--compile]
    python tests/bench/perf_worker.py load --path RUN/.loss.json --how curve|entries

`throughput`: training steps of the reference GPT (nanoGPT-style), of ours (daemon/model.py in the
plain loop below) or of the plain GPT (tests/bench/plain_gpt.py: our shapes, PyTorch's own dropout
and attention), on the same config, batch, threads and precision; prints {"step_s": [...],
"tokens_per_step": N}. Random tokens stand in for data (the cost
of a step does not depend on which bytes it trains on).

`load`: the canonical loss curve read the way `andreactl plot` reads it (`read_curve`), or as
`LossEntry` models (`read_entries` + `canonical_curve`), then drawn as the audit plot (`audit_figure`, saved as PNG); prints
{"load_s": ..., "load_and_plot_s": ..., "steps": N}. A fresh process, like the command: every page
the load touches is a first touch, which a loop inside one process would hide.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from andrea.protocol.lossentry import LossEntry

sys.path.insert(0, str(Path(__file__).resolve().parent))


def build(kind: str, preset: str, dropout: float | None, compile_: bool):
    from andrea.daemon.config import build_config

    cfg = build_config({}, {"preset": preset})
    mc = cfg.model if dropout is None else cfg.model.model_copy(update={"dropout": dropout})
    torch.manual_seed(0)
    if kind == "plain":
        from plain_gpt import PlainGPT, plain_step

        model = PlainGPT(mc)
        opt = model.make_optimizer(cfg.optim)
        fwd = torch.compile(model) if compile_ else model

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            return plain_step(fwd, opt, x, y)  # type: ignore[arg-type]
    elif kind == "ref":
        from reference_gpt import ReferenceGPT, train_step

        model = ReferenceGPT(
            mc.vocab_size, mc.block_size, mc.n_layer, mc.n_head, mc.n_embd, mc.dropout, mc.bias
        )
        opt = model.make_optimizer(cfg.optim.lr, cfg.optim.weight_decay)
        fwd = torch.compile(model) if compile_ else model

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            return train_step(fwd, opt, x, y)  # type: ignore[arg-type]
    else:
        from andrea.daemon.model import GPT
        from andrea.daemon.trainer.parts import adamw

        model = GPT(mc)
        opt = adamw(model, cfg.optim)
        params = list(model.parameters())
        fwd = torch.compile(model) if compile_ else model

        def step(x: torch.Tensor, y: torch.Tensor) -> float:
            # Exactly the math of StepRunner.train, without the data pipeline and bookkeeping.
            _, loss = fwd(x, y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip, foreach=True)
            opt.step()
            return loss.item()

    model.train()
    return cfg, mc, step


def throughput(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    cfg, mc, step = build(args.model, args.preset, args.dropout, args.compile)
    g = torch.Generator().manual_seed(1)
    batch = cfg.batch_size if args.batch_size is None else args.batch_size
    xy = torch.randint(0, mc.vocab_size, (batch, mc.block_size + 1), generator=g)
    x, y = xy[:, :-1], xy[:, 1:]
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        step(x, y)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    return {
        "step_s": times,
        "tokens_per_step": batch * mc.block_size,
        "threads": torch.get_num_threads(),
    }


def models(args: argparse.Namespace) -> dict:
    """Our GPT and the plain one in the same plain loop, in one process, step by step in turn (the
    order alternating), at dropout 0 and 0.1: wall and CPU seconds per step. On a loaded machine
    the CPU time of a one-thread step is the steadier measure of the work each model does."""
    torch.set_num_threads(args.threads)
    cfg, _, _ = build("ours", args.preset, None, False)
    g = torch.Generator().manual_seed(1)
    xy = torch.randint(0, 256, (cfg.batch_size, cfg.model.block_size + 1), generator=g)
    x, y = xy[:, :-1], xy[:, 1:]
    steps = {
        f"{kind} p={p}": build(kind, args.preset, p, False)[2]
        for p in (0.0, 0.1)
        for kind in ("plain", "ours")
    }
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    names = list(steps)
    for r in range(args.warmup + args.steps):
        for k in names if r % 2 else names[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            steps[k](x, y)
            if r >= args.warmup:
                wall[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
    return {"threads": args.threads, "wall_s": wall, "cpu_s": cpu}


def load(args: argparse.Namespace) -> dict:
    from andrea.control.plot import audit_figure, save_figure
    from andrea.control.run_events import RunEvents
    from andrea.daemon.rundir.losslog import LossCurve, canonical_curve, read_curve, read_entries

    t0 = time.perf_counter()
    if args.how == "curve":
        curve = read_curve(args.path)
    else:
        entries = canonical_curve(read_entries(args.path))
        columns = {
            name: np.array([getattr(e, name) for e in entries]) for name in LossEntry.model_fields
        }
        curve = LossCurve(**columns, entries_read=len(entries))
    t1 = time.perf_counter()
    save_figure(audit_figure(curve, RunEvents()), args.path.with_suffix(".png"))
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "load_and_plot_s": t2 - t0, "steps": len(curve)}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("--model", choices=["ref", "ours", "plain"], required=True)
    t.add_argument("--preset", default="andrea-12m")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--steps", type=int, default=6)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--batch-size", type=int)
    t.add_argument("--dropout", type=float)
    t.add_argument("--compile", action="store_true")
    mo = sub.add_parser("models")
    mo.add_argument("--preset", default="andrea-12m")
    mo.add_argument("--threads", type=int, default=1)
    mo.add_argument("--steps", type=int, default=8)
    mo.add_argument("--warmup", type=int, default=1)
    ld = sub.add_parser("load")
    ld.add_argument("--path", type=Path, required=True)
    ld.add_argument("--how", choices=["curve", "entries"], required=True)
    args = ap.parse_args()
    run = {"throughput": throughput, "models": models, "load": load}[args.cmd]
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
