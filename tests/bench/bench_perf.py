"""The performance suite: every comparison of docs/performance.md, side by side, in one run.

    .venv/bin/python tests/bench/bench_perf.py [--quick] [--rounds 7] [--only write,stall,throughput,cadence,sigterm,losslog]
                                                [--out-dir DIR] [--cache-dir DIR]

Writes DIR/perf.json and DIR/perf.md (default DIR: $TMPDIR/andrea-bench). Not collected by pytest.
Methods are interleaved (A B C A B C …, the order rotated every round) and medians compared, because
the disk and the two cores of a shared machine are noisy.

- write: checkpoint write (`CheckpointManager.save`: .bin + manifest, fsync'd) against `dd conv=fsync`
  of the same byte count, a plain raw write of the three arrays, `torch.save` and safetensors of the
  same three tensors (each fsync'd), at andrea-12m and andrea-120m size; then the read-back with
  sha256 verification (`CheckpointManager.verify`) against a cold sequential read of the same file.
- stall: a real `Trainer` (andrea-12m and andrea-120m): the time the training loop is held by a
  cadence checkpoint (`Checkpointer.write_in_background`) against the snapshot copy alone
  (`StagingBuffer.fill`), and the background write's duration.
- throughput: the reference GPT (tests/bench/reference_gpt.py, built like nanoGPT's model.py) against
  ours, same config (andrea-12m: dropout 0.1), batch, threads and precision, fresh processes; and the
  real `andrea-trainer` (checkpoints off) against the bare loop: what the machinery costs per step.
- cadence: `andrea-trainer` with cadence checkpoints against checkpoints off (throughput ratio).
- sigterm: SIGTERM-to-exit against one step + one synchronous checkpoint write + 0.5 s (bench_stop.py).
- losslog: `.loss.json` append at entry 200,000 against entry 1 (bench_losslog.py), and the load
  (`read_curve`) and load + plot (`read_curve` + `audit_figure`, what `andreactl plot` does) of 200,000
  entries against `read_entries` + `canonical_curve`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from andrea.daemon.checkpoint import format as checkpoint_format  # noqa: E402
from andrea.daemon.checkpoint.manager import CheckpointManager, Snapshot, layout_of  # noqa: E402
from andrea.daemon.checkpoint.writer import StagingBuffer  # noqa: E402
from andrea.daemon.config import CheckpointConfig, build_config  # noqa: E402
from andrea.daemon.rundir import layout as rundir  # noqa: E402

THREADS = 2


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def interleave(
    methods: dict[str, Callable[[], object]],
    rounds: int,
    before: Callable[[str], None] | None = None,
    label: str = "",
) -> dict[str, list[float]]:
    """Time each method once per round, rotating the order every round."""
    names = list(methods)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for k in order:
            if before is not None:
                before(k)
            t0 = time.perf_counter()
            methods[k]()
            times[k].append(time.perf_counter() - t0)
        print(
            f"  {label} round {r + 1}/{rounds}: "
            + ", ".join(f"{k}={times[k][-1]:.3f}" for k in names),
            flush=True,
        )
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict]:
    return {
        k: {"median_s": med(v), "min_s": min(v), "max_s": max(v), "runs": v}
        for k, v in times.items()
    }


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- manifest fields as the trainer writes them ----------------------------------------------------


def manifest_fields(preset: str) -> tuple[int, dict]:
    from andrea.daemon.checkpoint import rngstate
    from andrea.daemon.checkpoint.manifest import (
        Environment,
        Manifest,
        MixingState,
        OptimizerState,
        Progress,
    )
    from andrea.daemon.model import GPT
    from andrea.daemon.trainer.schedule import scheduler_state

    cfg = build_config({}, {"preset": preset})
    with torch.device("meta"):
        model = GPT(cfg.model)
    layout = layout_of((n, tuple(p.shape)) for n, p in model.named_parameters())
    n = sum(p.numel() for p in model.parameters())
    o = cfg.optim
    fields = dict(
        layout=layout,
        model=cfg.model,
        optimizer=OptimizerState(
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            weight_decay=o.weight_decay,
            grad_clip=o.grad_clip,
            fused=True,
            adam_step=1,
        ),
        scheduler=scheduler_state(1, o),
        rng=rngstate.capture(),
        data=[],
        mixing=MixingState(mode="fixed", arms=[]),
        progress=Progress(step=1, tokens_seen=0, segment=1, train_seconds=0.0),
        environment=Environment(
            device="cpu",
            dtype="float32",
            threads=THREADS,
            torch_version=torch.__version__,
            numpy_version=np.__version__,
            python_version=platform.python_version(),
            code_version="bench",
        ),
        config_hash="0" * 64,
        config=cfg.model_dump(mode="json"),
    )
    if "pending_losses" in Manifest.model_fields:
        fields["pending_losses"] = []
    return n, fields


# ---- 1. checkpoint write and read ------------------------------------------------------------------


def bench_io(preset: str, rounds: int, work: Path) -> dict:
    n, fields = manifest_fields(preset)
    size = checkpoint_format.payload_size(n)
    d = work / preset
    shutil.rmtree(d, ignore_errors=True)
    (d / "ours").mkdir(parents=True)
    print(f"[write] {preset}: n={n:,}, {size / 1e6:.1f} MB", flush=True)
    t0 = time.perf_counter()
    staging = StagingBuffer(n)
    alloc_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    w, m, v = (
        torch.randn(n, generator=g),
        torch.randn(n, generator=g) * 1e-3,
        torch.rand(n, generator=g) * 1e-6,
    )
    t0 = time.perf_counter()
    staging.fill(1, [w], [m], [v])
    copy_s = time.perf_counter() - t0
    snap = Snapshot(step=1, fields=fields, payload=staging.array)
    mgr = CheckpointManager(d / "ours", CheckpointConfig(keep_latest=2))
    arrays = [w.numpy(), m.numpy(), v.numpy()]

    def dd() -> None:
        subprocess.run(
            [
                "dd",
                "if=/dev/zero",
                f"of={d / 'dd.bin'}",
                "bs=8M",
                f"count={size}",
                "iflag=count_bytes",
                "conv=fsync",
            ],
            check=True,
            capture_output=True,
        )

    def raw() -> None:
        fd = os.open(d / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, checkpoint_format.HEADER.pack(1, n))
            for a in arrays:
                mv = memoryview(a).cast("B")
                for i in range(0, len(mv), 8 << 20):
                    os.write(fd, mv[i : i + (8 << 20)])
            os.fsync(fd)
        finally:
            os.close(fd)

    def tsave() -> None:
        with open(d / "t.pt", "wb") as f:
            torch.save({"weights": w, "m": m, "v": v}, f)
            f.flush()
            os.fsync(f.fileno())

    methods: dict[str, Callable[[], object]] = {
        "dd conv=fsync": dd,
        "raw write": raw,
        "torch.save": tsave,
    }
    try:
        import safetensors.torch as st

        def ssave() -> None:
            st.save_file({"weights": w, "m": m, "v": v}, str(d / "s.safetensors"))
            fsync_path(d / "s.safetensors")

        methods["safetensors"] = ssave
    except ImportError:
        st = None
        print("  (safetensors not installed: skipped; pip install safetensors)")
    methods["ours (.bin + manifest)"] = lambda: mgr.save(snap, "cadence")
    outputs = {
        "dd conv=fsync": ["dd.bin"],
        "raw write": ["raw.bin"],
        "torch.save": ["t.pt"],
        "safetensors": ["s.safetensors"],
        "ours (.bin + manifest)": ["ours/step_000001.bin", "ours/step_000001.json"],
    }

    def clean(k: str) -> None:  # every method writes a new file, like a new checkpoint; not timed
        for name in outputs[k]:
            (d / name).unlink(missing_ok=True)
        os.sync()

    write = summarize(interleave(methods, rounds, clean, f"write {preset}"))
    ours_w = write["ours (.bin + manifest)"]["median_s"]
    out: dict = {
        "n_params": n,
        "bytes": size,
        "staging_alloc_s": alloc_s,
        "snapshot_copy_s": copy_s,
        "write": write,
        "write_ratio_vs_dd": ours_w / write["dd conv=fsync"]["median_s"],
        "write_ratio_vs_torch_save": ours_w / write["torch.save"]["median_s"],
        "write_ratio_vs_raw": ours_w / write["raw write"]["median_s"],
    }
    if "safetensors" in write:
        out["write_ratio_vs_safetensors"] = ours_w / write["safetensors"]["median_s"]

    # Read-back: every file written once more, then read cold (its pages dropped from the cache).
    for k in methods:
        clean(k)
        methods[k]()
    read_buf = StagingBuffer(n).array  # the trainer reads into its (pre-faulted) staging buffer
    bin_path = d / "ours" / rundir.bin_name(1)

    def dd_read() -> None:
        subprocess.run(
            ["dd", f"if={bin_path}", "of=/dev/null", "bs=8M"], check=True, capture_output=True
        )

    def py_read() -> None:
        mv = memoryview(read_buf)
        fd = os.open(bin_path, os.O_RDONLY)
        try:
            pos = 0
            while pos < size:
                pos += os.readv(fd, [mv[pos : min(pos + (8 << 20), size)]])
        finally:
            os.close(fd)

    def verify() -> None:
        man, payload = mgr.verify(1, read_buf)
        assert payload.step == 1

    def tload() -> None:
        torch.load(d / "t.pt", weights_only=True)

    reads: dict[str, Callable[[], object]] = {
        "dd read (cold)": dd_read,
        "sequential read, no hash (cold)": py_read,
        "ours verify, sha256 (cold)": verify,
        "torch.load (cold)": tload,
    }
    files = {
        "dd read (cold)": bin_path,
        "sequential read, no hash (cold)": bin_path,
        "ours verify, sha256 (cold)": bin_path,
        "torch.load (cold)": d / "t.pt",
    }
    # (safetensors' load_file is left out: it maps the file and reads pages lazily, so its time is
    # not a read of the data.)
    read = summarize(interleave(reads, rounds, lambda k: drop_cache(files[k]), f"read {preset}"))
    ours_r = read["ours verify, sha256 (cold)"]["median_s"]
    out |= {
        "read": read,
        "verify_ratio_vs_dd_read": ours_r / read["dd read (cold)"]["median_s"],
        "verify_ratio_vs_sequential_read": ours_r
        / read["sequential read, no hash (cold)"]["median_s"],
        "sha256_alone_s": _sha256_time(read_buf[:size]),
    }
    mgr.close()
    shutil.rmtree(d, ignore_errors=True)
    return out


def _sha256_time(buf: np.ndarray) -> float:
    import hashlib

    mv = memoryview(buf)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        h = hashlib.sha256()
        for i in range(0, len(mv), 8 << 20):
            h.update(mv[i : i + (8 << 20)])
        times.append(time.perf_counter() - t0)
    return med(times)


# ---- 2. stall of a cadence checkpoint, in a real Trainer ------------------------------------------


def bench_stall(preset: str, rounds: int, work: Path, cache: Path) -> dict:
    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.daemon.trainer.factory import assemble
    from andrea.daemon.trainer.options import TrainerOptions

    run_dir = work / f"stall-{preset}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cfg = build_config(
        {},
        {
            "preset": preset,
            "threads": THREADS,
            "data": {"cache_dir": str(cache)},
            "checkpoint": {"every": 0, "keep_latest": 2},
        },
    )
    print(f"[stall] {preset}: building a real Trainer", flush=True)
    tr = assemble(TrainerOptions(run_dir, cfg), OperatorRequests())
    # Adam's state exists after one update; a real step of andrea-120m takes a minute on two cores,
    # and what a snapshot copies does not depend on the values, so one update with random gradients.
    parts, counters, ckpt = tr.ctx.parts, tr.ctx.counters, tr.checkpointer
    for p in parts.params:
        p.grad = torch.randn_like(p) * 1e-3
    parts.optimizer.step()
    parts.optimizer.zero_grad()
    counters.step = 1
    ms, vs = parts.moments()
    writes: list[float] = []
    store = ckpt.storage
    assert store is not None  # a single process is rank 0
    orig_save = store.manager.save

    def timed_save(*a, **k):
        t0 = time.perf_counter()
        r = orig_save(*a, **k)
        writes.append(time.perf_counter() - t0)
        return r

    store.manager.save = timed_save  # type: ignore[method-assign]

    def copy_alone() -> None:
        store.snapshots.staging.fill(counters.step, parts.params, ms, vs)

    def stall() -> None:
        ckpt.write_in_background("cadence")

    def before(k: str) -> None:
        ckpt.wait_for_write()  # both measured with no write in flight (the cadence is far longer than a write)
        if k == "stall":
            counters.step += 1
            counters.last_saved = 0

    times = summarize(
        interleave(
            {"snapshot copy alone": copy_alone, "stall (snapshot + submit)": stall},
            rounds,
            before,
            f"stall {preset}",
        )
    )
    ckpt.wait_for_write()
    t0 = time.perf_counter()
    ckpt.write("end")  # synchronous, for the record
    sync_s = time.perf_counter() - t0
    tr.ctx.flags.request_stop("bench")
    counters.last_saved = counters.step
    tr.finish()
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "n_params": sum(p.numel() for p in parts.params),
        **times,
        "stall_ratio_vs_copy": times["stall (snapshot + submit)"]["median_s"]
        / times["snapshot copy alone"]["median_s"],
        "background_write_s": med(writes) if writes else None,
        "synchronous_checkpoint_s": sync_s,
    }


# ---- 3. throughput: reference GPT vs ours vs andrea-trainer ---------------------------------------


def _worker(
    model: str, steps: int, warmup: int, preset: str, dropout: float | None = None
) -> list[float]:
    extra = [] if dropout is None else ["--dropout", str(dropout)]
    res = subprocess.run(
        [
            sys.executable,
            str(HERE / "perf_worker.py"),
            "throughput",
            "--model",
            model,
            "--preset",
            preset,
            "--threads",
            str(THREADS),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            *extra,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])["step_s"]


def _trainer_steps(
    preset: str,
    steps: int,
    warmup: int,
    cache: Path,
    every: int,
    stalls: list[float] | None = None,
    dropout: float | None = None,
) -> list[float]:
    """Per-step wall times of a real andrea-trainer (its own progress lines, one per step: each covers
    the whole loop iteration, checkpoint stall included)."""
    with tempfile.TemporaryDirectory(prefix="andrea-bench-") as d:
        if dropout is not None:
            (Path(d) / "run.toml").write_text(
                f'preset = "{preset}"\n[model]\ndropout = {dropout}\n'
            )
        cmd = [
            sys.executable,
            "-m",
            "andrea.daemon.trainer.service.cli",
            "--run-dir",
            d,
            "--preset",
            preset,
            "--threads",
            str(THREADS),
            "--max-steps",
            str(warmup + steps),
            "--checkpoint-every",
            str(every),
            "--sample-every",
            "0",
            "--log-every",
            "1",
            "--cache-dir",
            str(cache),
            "--log-level",
            "DEBUG",
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = []
    for m in re.finditer(r"step (\d+)/\d+ .*\| ([\d.]+) ms/step", res.stderr):
        if int(m.group(1)) > warmup:
            out.append(float(m.group(2)) / 1000)
    if stalls is not None:
        stalls.extend(float(x) for x in re.findall(r"handed over in ([\d.]+) s", res.stderr))
    return out


def bench_throughput(preset: str, rounds: int, steps: int, warmup: int, cache: Path) -> dict:
    per: dict[str, list[float]] = {
        "reference GPT": [],
        "ours (bare loop)": [],
        "andrea-trainer": [],
    }
    runs = {
        "reference GPT": lambda: _worker("ref", steps, warmup, preset),
        "ours (bare loop)": lambda: _worker("ours", steps, warmup, preset),
        "andrea-trainer": lambda: _trainer_steps(preset, steps, warmup, cache, every=0),
    }
    names = list(runs)
    for r in range(rounds):
        for k in names[r % 3 :] + names[: r % 3]:
            per[k].append(med(runs[k]()))
        print(
            f"  throughput round {r + 1}/{rounds}: "
            + ", ".join(f"{k}={per[k][-1]:.3f} s/step" for k in names),
            flush=True,
        )
    tokens = (
        build_config({}, {"preset": preset}).batch_size
        * build_config({}, {"preset": preset}).model.block_size
    )
    res = {
        k: {"median_step_s": med(v), "tokens_per_s": tokens / med(v), "rounds": v}
        for k, v in per.items()
    }
    # Paired ratios (same round) are less noisy than ratios of medians on a shared machine.
    speed = [a / b for a, b in zip(per["reference GPT"], per["ours (bare loop)"])]
    machinery = [a / b for a, b in zip(per["andrea-trainer"], per["ours (bare loop)"])]
    return {
        "preset": preset,
        "threads": THREADS,
        "tokens_per_step": tokens,
        **res,
        "speedup_vs_reference": med(per["reference GPT"]) / med(per["ours (bare loop)"]),
        "speedup_vs_reference_paired": med(speed),
        "machinery_overhead": med(per["andrea-trainer"]) / med(per["ours (bare loop)"]) - 1,
        "machinery_overhead_paired": med(machinery) - 1,
        "bookkeeping_per_step_s": _bookkeeping_cost(cache),
    }


def _bookkeeping_cost(cache: Path) -> float:
    """What the loop does per step besides the model's math, timed directly (in-process, andrea-12m):
    the arm, the batch (drawn, and taken from the worker that gathered and hashed it), the loss
    entry and its append, the watchdog tick, the flag checks."""
    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.daemon.trainer.factory import assemble
    from andrea.daemon.trainer.options import TrainerOptions
    from andrea.protocol.lossentry import LossEntry

    with tempfile.TemporaryDirectory(prefix="andrea-bench-") as d:
        cfg = build_config(
            {},
            {
                "preset": "andrea-12m",
                "threads": THREADS,
                "data": {"cache_dir": str(cache)},
                "checkpoint": {"every": 100},
            },
        )
        tr = assemble(TrainerOptions(Path(d), cfg), OperatorRequests())
        n = 200
        t0 = time.perf_counter()
        batches = tr.stepper.batches
        for s in range(1, n + 1):
            arm = tr.sink.arm_for(s)
            step = batches.draw(arm)
            batches.prefetch(tr.ctx.parts.mixture.assign(s + 1))
            step.micro(0)
            digest = step.digest()
            entry = LossEntry(
                step=s,
                loss=1.0,
                arm=tr.ctx.parts.arms[arm].name,
                lr=1e-3,
                tokens=2048,
                wall_time=time.time(),
                segment=tr.ctx.counters.segment,
                phase=0,
                batch_sha256=digest,
            )
            tr.sink.record_loss(entry)
            tr.ctx.notifier.tick()
            tr.checkpointer.boundary_allowed(s)
            tr.ctx.flags.take_checkpoint_request()
        per_step = (time.perf_counter() - t0) / n
        tr.finish()  # step 0: nothing to write
    return per_step


def bench_plain(preset: str, rounds: int, steps: int, warmup: int, cache: Path) -> dict:
    """The trainer's step against a plain training loop of the same model, at dropout 0 and 0.1:
    `plain loop, plain GPT` (tests/bench/plain_gpt.py: our shapes, PyTorch's dropout and attention,
    fused AdamW) is the baseline; `plain loop, our GPT` splits what the model adds from what the
    loop adds. Fresh processes, interleaved (the order rotated every round), paired per round."""
    names = ("plain loop, plain GPT", "plain loop, our GPT", "andrea-trainer")
    out: dict = {}
    for dropout in (0.0, 0.1):
        runs = {
            names[0]: lambda p=dropout: _worker("plain", steps, warmup, preset, p),
            names[1]: lambda p=dropout: _worker("ours", steps, warmup, preset, p),
            names[2]: lambda p=dropout: _trainer_steps(preset, steps, warmup, cache, 0, dropout=p),
        }
        per: dict[str, list[float]] = {k: [] for k in names}
        loads = []
        for r in range(rounds):
            for k in names[r % 3 :] + names[: r % 3]:
                per[k].append(med(runs[k]()))
            loads.append(os.getloadavg()[0])
            print(
                f"  plain dropout {dropout} round {r + 1}/{rounds} (load {loads[-1]:.1f}): "
                + ", ".join(f"{k}={per[k][-1]:.3f} s/step" for k in names),
                flush=True,
            )

        out[f"dropout {dropout}"] = {
            **{k: {"median_step_s": med(v), "rounds": v} for k, v in per.items()},
            "trainer_over_plain": _paired(per[names[2]], per[names[0]]),
            "our_model_over_plain": _paired(per[names[1]], per[names[0]]),
            "trainer_over_our_model": _paired(per[names[2]], per[names[1]]),
            "load_average": loads,
        }
    return {"preset": preset, "threads": THREADS, "steps": steps, **out}


def _paired(a: list[float], b: list[float]) -> dict:
    xs = [x / y for x, y in zip(a, b)]
    return {"median": med(xs), "min": min(xs), "max": max(xs), "rounds": xs}


def bench_batches(cache: Path, reps: int = 300) -> dict:
    """What a step's batch costs on its critical path, in one process with a real Trainer
    (andrea-12m): drawn, gathered and hashed in line (as before daemon/trainer/batch_loader.py) against
    drawn in line and taken from the worker that gathered and hashed it during the step before;
    and the hash alone. Interleaved, medians of `reps`."""
    import hashlib

    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.daemon.trainer.factory import assemble
    from andrea.daemon.trainer.options import TrainerOptions

    with tempfile.TemporaryDirectory(prefix="andrea-bench-") as d:
        cfg = build_config(
            {},
            {"preset": "andrea-12m", "threads": THREADS, "data": {"cache_dir": str(cache)}},
        )
        tr = assemble(TrainerOptions(Path(d), cfg), OperatorRequests())
        stream, batches = tr.ctx.parts.streams[0], tr.stepper.batches
        times: dict[str, list[float]] = {"in line": [], "from the worker": [], "sha256 alone": []}
        for _ in range(reps):
            t0 = time.perf_counter()
            batch = stream.next_batch(cfg.batch_size)
            hashlib.sha256(batch.tobytes()).hexdigest()
            torch.from_numpy(batch)
            times["in line"].append(time.perf_counter() - t0)
            batches.prefetch(0)
            time.sleep(0.002)  # the step the worker runs beside
            t0 = time.perf_counter()
            step = batches.draw(0)
            step.micro(0)
            step.digest()
            times["from the worker"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hashlib.sha256(batch.tobytes()).hexdigest()
            times["sha256 alone"].append(time.perf_counter() - t0)
        tr.ctx.flags.request_stop("bench")
        tr.finish()
    res = {k: med(v) for k, v in times.items()}
    return {**res, "worker_over_in_line": res["from the worker"] / res["in line"]}


def bench_cadence(
    preset: str, rounds: int, steps: int, warmup: int, every: int, cache: Path
) -> dict:
    """Mean step time with cadence checkpoints against none. The timed window is at least one whole
    cadence period and starts half a period in, so that a checkpoint and everything it costs
    afterwards (the background write, retention) fall inside it.

    Whole runs drift by ±10 % against each other on a shared machine, more than the effect measured,
    so the ratio is also estimated within runs: a run's *excess* is the time its steps spent above
    that run's median step; the checkpoint's cost per period is the median excess of the runs with
    checkpoints minus that of the runs without (which is what noise alone adds)."""
    steps, warmup = max(steps, every), max(warmup, every // 2)
    per: dict[str, list[float]] = {"checkpoints off": [], f"checkpoint every {every}": []}
    excess: dict[str, list[float]] = {k: [] for k in per}
    typical: list[float] = []
    stalls: list[float] = []
    for r in range(rounds):
        for k in list(per) if r % 2 == 0 else list(per)[::-1]:
            ts = _trainer_steps(
                preset,
                steps,
                warmup,
                cache,
                every=0 if k == "checkpoints off" else every,
                stalls=stalls,
            )
            per[k].append(statistics.fmean(ts))  # mean: the checkpoint steps must count
            typical.append(med(ts))
            excess[k].append(
                sum(t - typical[-1] for t in ts) * every / len(ts)
            )  # per cadence period
        print(
            f"  cadence round {r + 1}/{rounds}: "
            + ", ".join(
                f"{k}={v[-1]:.3f} s/step (excess {excess[k][-1]:.2f} s)" for k, v in per.items()
            ),
            flush=True,
        )
    off, on = med(per["checkpoints off"]), med(per[f"checkpoint every {every}"])
    paired = [a / b for a, b in zip(per["checkpoints off"], per[f"checkpoint every {every}"])]
    cost = med(excess[f"checkpoint every {every}"]) - med(excess["checkpoints off"])
    period = every * med(typical)
    return {
        "preset": preset,
        "every": every,
        "steps": steps,
        **{k: {"mean_step_s": v, "excess_per_period_s": excess[k]} for k, v in per.items()},
        "throughput_ratio": off / on,
        "throughput_ratio_paired": med(paired),
        "checkpoint_cost_per_period_s": cost,
        "period_s": period,
        "throughput_ratio_within_runs": period / (period + cost),
        "stall_s": {"median": med(stalls), "max": max(stalls), "samples": len(stalls)}
        if stalls
        else None,
    }


# ---- 4. SIGTERM to exit ---------------------------------------------------------------------------


def bench_sigterm(presets: list[str], rounds: int, cache: Path) -> dict:
    import bench_stop

    rng = random.Random(0)
    out = {}
    for preset in presets:
        rs = []
        for i in range(rounds):
            rs.append(bench_stop.one_round(preset, str(cache), rng))
            print(
                f"  sigterm {preset} round {i + 1}/{rounds}: exit {rs[-1]['sigterm_to_exit_s']:.2f} s, "
                f"budget {rs[-1]['budget_s']:.2f} s",
                flush=True,
            )
        out[preset] = {k: med([r[k] for r in rs]) for k in rs[0]} | {
            "max_exit_over_budget": max(r["exit_over_budget"] for r in rs),
            "rounds": rs,
        }
    return out


# ---- 5. .loss.json ---------------------------------------------------------------------------------


def bench_losslog(entries: int, work: Path) -> dict:
    out_json = work / "losslog.json"
    subprocess.run(
        [
            sys.executable,
            str(HERE / "bench_losslog.py"),
            "--entries",
            str(entries),
            "--out",
            str(out_json),
            "--dir",
            str(work),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    res = json.loads(out_json.read_text())
    # Load and plot as `andreactl plot` does them (read_curve, then the audit figure of its columns), against the
    # load it did before read_curve (every entry a LossEntry, then canonical_curve): each in a fresh
    # process, like the command, alternated.
    from bench_losslog import make_entries

    from andrea.daemon.rundir.losslog import LossLog

    path = work / "plot.json"
    path.unlink(missing_ok=True)
    with LossLog.open(path) as log:
        for first in range(1, entries + 1, 10_000):
            log.append_many(make_entries(first, min(10_000, entries + 1 - first)))
    runs: dict[str, list[dict]] = {"curve": [], "entries": []}
    for r in range(7):
        for how in ("curve", "entries") if r % 2 == 0 else ("entries", "curve"):
            out = subprocess.run(
                [
                    sys.executable,
                    str(HERE / "perf_worker.py"),
                    "load",
                    "--path",
                    str(path),
                    "--how",
                    how,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[how].append(json.loads(out.strip().splitlines()[-1]))
    assert all(x["steps"] == entries for v in runs.values() for x in v)
    path.unlink()
    res["read_curve_s"] = med([x["load_s"] for x in runs["curve"]])
    res["read_curve_and_plot_s"] = med([x["load_and_plot_s"] for x in runs["curve"]])
    res["read_entries_canonical_s"] = med([x["load_s"] for x in runs["entries"]])
    res["read_curve_vs_read_entries"] = med(
        [a["load_s"] / b["load_s"] for a, b in zip(runs["curve"], runs["entries"])]
    )
    return res


# ---- report -----------------------------------------------------------------------------------------


def markdown(r: dict) -> str:
    L = [
        f"# Performance report ({r['created_utc']})",
        "",
        f"{r['machine']['cpus']} CPUs, torch {r['machine']['torch']}, {THREADS} threads, rounds {r['rounds']}; "
        f"medians of interleaved runs. Generated by `tests/bench/bench_perf.py`.",
        "",
    ]
    if "io" in r:
        L += [
            "## 1. Checkpoint write and read-back",
            "",
            "| size | method | median s | min s |",
            "|---|---|---:|---:|",
        ]
        for preset, x in r["io"].items():
            for k, v in x["write"].items():
                L.append(
                    f"| {preset} ({x['bytes'] / 1e6:.0f} MB) | write: {k} | {v['median_s']:.3f} | {v['min_s']:.3f} |"
                )
            for k, v in x["read"].items():
                L.append(f"| {preset} | read: {k} | {v['median_s']:.3f} | {v['min_s']:.3f} |")
        L += [
            "",
            "| size | ours ÷ dd (≤ 1.1) | ours ÷ torch.save (≤ 0.8 at 120M) | ours ÷ safetensors | ours ÷ raw | verify ÷ dd read (≤ 1.2) | verify ÷ sequential read | sha256 alone s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for preset, x in r["io"].items():
            L.append(
                f"| {preset} | {x['write_ratio_vs_dd']:.2f} | {x['write_ratio_vs_torch_save']:.2f} | "
                f"{x.get('write_ratio_vs_safetensors', float('nan')):.2f} | {x['write_ratio_vs_raw']:.2f} | "
                f"{x['verify_ratio_vs_dd_read']:.2f} | {x['verify_ratio_vs_sequential_read']:.2f} | {x['sha256_alone_s']:.3f} |"
            )
        L.append("")
    if "stall" in r:
        L += [
            "## 2. Training stall of a cadence checkpoint (real Trainer)",
            "",
            "| preset | snapshot copy alone s | stall seen by the loop s | ratio (≤ 1.5) | background write s | synchronous checkpoint s |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for preset, x in r["stall"].items():
            L.append(
                f"| {preset} | {x['snapshot copy alone']['median_s']:.4f} | {x['stall (snapshot + submit)']['median_s']:.4f} | "
                f"{x['stall_ratio_vs_copy']:.2f} | {x['background_write_s'] or float('nan'):.3f} | {x['synchronous_checkpoint_s']:.3f} |"
            )
        L.append("")
    if "cadence" in r:
        x = r["cadence"]
        L += [
            f"Throughput with a checkpoint every {x['every']} steps ÷ checkpoints off ({x['preset']}, mean over {x['steps']} steps): "
            f"**{x['throughput_ratio']:.3f}** (paired {x['throughput_ratio_paired']:.3f}; within runs "
            f"{x['throughput_ratio_within_runs']:.3f}: {x['checkpoint_cost_per_period_s']:.2f} s per {x['period_s']:.0f} s period; "
            "target ≥ 0.98 at every 100)"
            + (
                f"; stall in the real loop: median {x['stall_s']['median']:.4f} s, max {x['stall_s']['max']:.4f} s."
                if x["stall_s"]
                else "."
            ),
            "",
        ]
    if "throughput" in r:
        x = r["throughput"]
        L += [
            f"## 3. Training throughput ({x['preset']}, {x['tokens_per_step']} tokens/step, {x['threads']} threads, fp32)",
            "",
            "| implementation | s/step | tokens/s |",
            "|---|---:|---:|",
        ]
        for k in ("reference GPT", "ours (bare loop)", "andrea-trainer"):
            L.append(f"| {k} | {x[k]['median_step_s']:.3f} | {x[k]['tokens_per_s']:.0f} |")
        L += [
            "",
            f"Ours ÷ reference speed: **{x['speedup_vs_reference']:.3f}×** (paired {x['speedup_vs_reference_paired']:.3f}×; target ≥ 1.15). "
            f"Trainer machinery over the bare loop: {100 * x['machinery_overhead']:+.1f}% (paired {100 * x['machinery_overhead_paired']:+.1f}%; "
            f"bookkeeping timed directly: {1000 * x['bookkeeping_per_step_s']:.2f} ms/step = "
            f"{100 * x['bookkeeping_per_step_s'] / x['ours (bare loop)']['median_step_s']:.2f}% of a step; target ≤ 1%).",
            "",
        ]
    if "plain" in r:
        x = r["plain"]
        L += [
            f"## 3b. The trainer against a plain loop ({x['preset']}, {x['threads']} threads, {x['steps']} steps a run)",
            "",
            "| dropout | plain loop, plain GPT s/step | plain loop, our GPT | andrea-trainer | trainer ÷ plain (≤ 1.02) | our GPT ÷ plain GPT | trainer ÷ our GPT | load |",
            "|---|---:|---:|---:|---|---|---|---|",
        ]
        for key in ("dropout 0.0", "dropout 0.1"):
            y = x[key]

            def span(z: dict) -> str:
                return f"{z['median']:.3f} [{z['min']:.3f}–{z['max']:.3f}]"

            L.append(
                f"| {key.split()[1]} | {y['plain loop, plain GPT']['median_step_s']:.3f} | {y['plain loop, our GPT']['median_step_s']:.3f} | "
                f"{y['andrea-trainer']['median_step_s']:.3f} | {span(y['trainer_over_plain'])} | {span(y['our_model_over_plain'])} | "
                f"{span(y['trainer_over_our_model'])} | {min(y['load_average']):.1f}–{max(y['load_average']):.1f} |"
            )
        L.append("")
    if "batches" in r:
        x = r["batches"]
        L += [
            f"A step's batch on the critical path (andrea-12m): in line {1e6 * x['in line']:.0f} µs, from the worker "
            f"{1e6 * x['from the worker']:.0f} µs (ratio {x['worker_over_in_line']:.2f}); sha256 alone {1e6 * x['sha256 alone']:.0f} µs.",
            "",
        ]
    if "sigterm" in r:
        L += [
            "## 4. SIGTERM to exit",
            "",
            "| preset | step s | sync write s | exit s | budget s | exit ÷ budget (≤ 1) | worst |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p, x in r["sigterm"].items():
            L.append(
                f"| {p} | {x['step_s']:.3f} | {x['checkpoint_write_s']:.3f} | {x['sigterm_to_exit_s']:.2f} | {x['budget_s']:.2f} | "
                f"{x['exit_over_budget']:.2f} | {x['max_exit_over_budget']:.2f} |"
            )
        L.append("")
    if "losslog" in r:
        x = r["losslog"]
        L += [
            f"## 5. `.loss.json` at {x['entries']:,} entries ({x['file_bytes'] / 1e6:.1f} MB)",
            "",
            "| append mode | at 1 µs | at N µs | ratio (≤ 1.2) |",
            "|---|---:|---:|---:|",
        ]
        for mode, a in x["append"].items():
            L.append(
                f"| {mode} | {a['at_1']['median_us']:.1f} | {a['at_far']['median_us']:.1f} | {a['ratio']:.2f} |"
            )
        L += [
            "",
            f"Load (`read_curve`): {x['read_curve_s']:.3f} s, against {x['read_entries_canonical_s']:.3f} s for "
            f"`read_entries` + `canonical_curve` (paired ratio {x['read_curve_vs_read_entries']:.2f}), each in a fresh process; load + SVG plot "
            f"(`andreactl plot`): {x['read_curve_and_plot_s']:.3f} s; `LossLog.open`: {x['open']['median_s']:.3f} s.",
            "",
        ]
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="3 rounds, andrea-12m sizes only, fewer steps (a smoke run)",
    )
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", default="write,stall,throughput,plain,cadence,sigterm,losslog")
    ap.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "andrea-bench")
    ap.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where files are written (default: inside --out-dir)",
    )
    ap.add_argument("--cache-dir", type=Path, default=Path(os.path.expanduser("~/.cache/andrea")))
    ap.add_argument(
        "--cadence-every",
        type=int,
        default=10,
        help="cadence of the throughput-with-checkpoints run (stricter than 100)",
    )
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    only = set(args.only.split(","))
    rounds = 3 if args.quick else args.rounds
    sizes = ["andrea-12m"] if args.quick else ["andrea-12m", "andrea-120m"]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    work = args.work_dir or (args.out_dir / "work")
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "rounds": rounds,
        "machine": {
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "load_average_1min_start": os.getloadavg()[0],
        },
    }

    def save() -> None:
        report["machine"]["load_average_1min_end"] = os.getloadavg()[0]
        (args.out_dir / "perf.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (args.out_dir / "perf.md").write_text(markdown(report))

    if "write" in only:
        report["io"] = {p: bench_io(p, rounds, work) for p in sizes}
        save()
    if "stall" in only:
        report["stall"] = {p: bench_stall(p, rounds, work, args.cache_dir) for p in sizes}
        save()
    if "throughput" in only:
        report["throughput"] = bench_throughput(
            "andrea-12m", rounds, 3 if args.quick else 5, 2, args.cache_dir
        )
        save()
    if "plain" in only:
        report["plain"] = bench_plain(
            "andrea-12m",
            3 if args.quick else args.rounds,
            3 if args.quick else 5,
            2,
            args.cache_dir,
        )
        report["batches"] = bench_batches(args.cache_dir)
        save()
    if "cadence" in only:
        report["cadence"] = bench_cadence(
            "andrea-12m",
            2 if args.quick else 3,
            20 if args.quick else 30,
            2,
            args.cadence_every,
            args.cache_dir,
        )
        save()
    if "sigterm" in only:
        report["sigterm"] = bench_sigterm(
            ["andrea-tiny", "andrea-12m"], 2 if args.quick else 3, args.cache_dir
        )
        save()
    if "losslog" in only:
        report["losslog"] = bench_losslog(200_000, work)
        save()
    shutil.rmtree(work, ignore_errors=True)
    print(markdown(report))
    print(f"written: {args.out_dir / 'perf.json'}, {args.out_dir / 'perf.md'}")


if __name__ == "__main__":
    main()
