"""The two ways an FSDP job could write the flat `.bin`, measured at andrea-120m on this machine.

    .venv/bin/torchrun --standalone --nproc-per-node 2 tests/bench/bench_fsdp_save.py [--preset andrea-120m] [--dir DIR]

Each of 2 ranks (gloo, CPU) holds one half of the flat weights, m and v, as FSDP would shard them.

- `gather`: the shards are gathered into rank 0's host buffer in the `.bin` layout, which rank 0
  writes with the checkpoint writer (fsync, rename, fsync of the directory);
- `dcp`: every rank saves its own shard with torch.distributed.checkpoint (in parallel), and a
  converter — one process, after the job — reads the shards straight into a memory map of the
  `.bin` (so it needs no host buffer of the whole state) and fsyncs it.

Reported per way: seconds and the peak resident memory of each process (ru_maxrss). docs/distributed.md
scales them to 7B parameters (bytes grow with n; bandwidths do not).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from andrea.daemon.checkpoint.format import HEADER, payload_size
from andrea.daemon.checkpoint.writer import write_payload
from andrea.daemon.config import build_config
from andrea.daemon.model import GPT


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def n_params(preset: str) -> int:
    with torch.device("meta"):
        return GPT(build_config({}, {"preset": preset}).model).n_params()


def convert(dcp_dir: Path, out: Path, n: int, world: int) -> None:
    """The offline converter: DCP shards → a memory-mapped `.bin`, no full-state host buffer."""
    import torch.distributed.checkpoint as dcp

    mm = np.memmap(out, dtype=np.uint8, mode="w+", shape=(payload_size(n),))
    mm[: HEADER.size] = np.frombuffer(HEADER.pack(1, n), dtype=np.uint8)
    flat = torch.from_numpy(mm[HEADER.size :].view(np.float32))
    half = n // world
    target = {}
    for r in range(world):
        lo, hi = r * half, (n if r == world - 1 else (r + 1) * half)
        for i, name in enumerate(("w", "m", "v")):
            target[f"{name}.{r}"] = flat[i * n + lo : i * n + hi]
    dcp.load(target, checkpoint_id=str(dcp_dir), no_dist=True)
    mm.flush()
    fd = os.open(out, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="andrea-120m")
    p.add_argument("--dir", type=Path, default=None)
    p.add_argument("--convert", nargs=3, metavar=("DCP_DIR", "OUT", "N"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.convert:
        t0 = time.perf_counter()
        convert(Path(a.convert[0]), Path(a.convert[1]), int(a.convert[2]), 2)
        print(f"convert {time.perf_counter() - t0:.2f} s rss {rss_gb():.2f} GB", flush=True)
        return
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = n_params(a.preset)
    half = n // world
    mine = n - half * (world - 1) if rank == world - 1 else half
    g = torch.Generator().manual_seed(rank)
    shards = [torch.randn(mine, generator=g) for _ in range(3)]
    base = a.dir or Path(tempfile.gettempdir())
    work = base / "andrea-bench-fsdp"
    if rank == 0:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    dist.barrier()
    before = rss_gb()

    # 1. gather to rank 0 in the .bin layout, then the usual durable write
    t0 = time.perf_counter()
    buf = np.empty(payload_size(n), dtype=np.uint8) if rank == 0 else None
    if rank == 0:
        buf[: HEADER.size] = np.frombuffer(HEADER.pack(1, n), dtype=np.uint8)
        flat = torch.from_numpy(buf[HEADER.size :].view(np.float32))
    for i, s in enumerate(shards):
        # equal shards for gather; the last rank's remainder is a few elements
        parts = (
            [flat[i * n + r * half : i * n + (r + 1) * half] for r in range(world)]
            if rank == 0
            else None
        )
        dist.gather(s[:half].contiguous(), parts, dst=0)
        if rank == 0 and mine > half:
            flat[i * n + world * half : (i + 1) * n] = s[half:]
    t_gather = time.perf_counter() - t0
    t0 = time.perf_counter()
    if rank == 0:
        write_payload(work / "gathered.bin", buf)
    t_write = time.perf_counter() - t0
    rss_gather = rss_gb()
    del buf
    dist.barrier()

    # 2. torch.distributed.checkpoint: each rank writes its shard
    t0 = time.perf_counter()
    dcp.save(
        {f"{k}.{rank}": s for k, s in zip(("w", "m", "v"), shards)}, checkpoint_id=str(work / "dcp")
    )
    t_dcp = time.perf_counter() - t0
    dist.barrier()
    report = torch.tensor([t_gather, t_write, t_dcp, before, rss_gather], dtype=torch.float64)
    got = [torch.zeros_like(report) for _ in range(world)]
    dist.all_gather(got, report)
    if rank == 0:
        print(f"{a.preset}: {n:,} parameters, .bin {payload_size(n) / 1e9:.2f} GB, {world} ranks")
        for r, x in enumerate(got):
            print(
                f"rank {r}: gather {x[0]:.2f} s, write {x[1]:.2f} s, dcp save {x[2]:.2f} s, "
                f"rss before {x[3]:.2f} GB, peak after gather+write {x[4]:.2f} GB"
            )
        res = subprocess.run(
            [
                sys.executable,
                __file__,
                "--convert",
                str(work / "dcp"),
                str(work / "converted.bin"),
                str(n),
            ],
            capture_output=True,
            text=True,
        )
        print("converter (one process):", res.stdout.strip() or res.stderr[-2000:])
        shutil.rmtree(work, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
