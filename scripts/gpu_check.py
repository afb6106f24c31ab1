#!/usr/bin/env python3
"""Every CUDA path of andrea in one command, on one GPU, in a few minutes; prints a report.

    .venv/bin/python scripts/gpu_check.py [--out report.md] [--keep DIR]

1. the CUDA tests (pytest: RNG state of the device in use, CUDA environment, deterministic step);
2. andrea-12m stopped by SIGTERM mid-run and resumed, against an uninterrupted run: the final .bin
   must be equal byte for byte (deterministic mode on and torch.compile on, the CUDA defaults: a
   compiled run resumed compiled);
3. the deterministic mode off and on: tokens/s, and whether two runs give the same bits; and the
   same run eager (--compile off): what compiling buys;
4. andrea-120m in bf16 (the CUDA default): tokens/s, the stall of a background checkpoint (the
   copy training waits for) and the time of the 120M write;
5. `andreactl plan`'s activation estimate against the CUDA allocator's measured peak of a step of
   andrea-120m in bf16, with the math (deterministic) and the fused attention.

Every figure comes from the trainer's own log lines. Needs a CUDA GPU; budget about 5 minutes on
one H100-class GPU (the first run also builds the corpus cache, ~20 s).
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def trainer(run_dir: Path, cache: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "andrea-trainer"),
        "--run-dir",
        str(run_dir),
        "--device",
        "cuda",
        "--cache-dir",
        str(cache),
        "--sample-every",
        "0",
        "--log-level",
        "DEBUG",
        *extra,
    ]


def run(cmd: list[str], stop_at: str | None = None, timeout: float = 600) -> tuple[int, str]:
    """Run to the end (or SIGTERM at the first line matching `stop_at`); (exit code, log)."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        lines.append(line)
        if stop_at and re.search(stop_at, line) and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            stop_at = None
        if time.monotonic() > deadline:
            proc.kill()
    return proc.wait(), "".join(lines)


def tok_s(log: str, skip: int = 2) -> float:
    vals = [float(x) for x in re.findall(r"\| (\d+) tok/s \|", log)][skip:]
    return statistics.median(vals) if vals else float("nan")


def same_bytes(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.read_bytes() == b.read_bytes()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--keep", type=Path, help="keep the run directories here")
    a = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible: nothing to check", file=sys.stderr)
        return 2
    work = a.keep or Path(tempfile.mkdtemp(prefix="andrea-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    report = [f"# GPU check: {torch.cuda.get_device_name(0)}", ""]
    t_start = time.monotonic()
    ok = True

    # 1. CUDA tests
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "tests/test_distributed_units.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else res.stderr[-500:]
    ok &= res.returncode == 0 and "skipped" not in summary
    report += ["## CUDA tests", f"`pytest tests/test_distributed_units.py`: {summary}", ""]

    # 2. SIGTERM and resume, andrea-12m, deterministic (auto = on for CUDA)
    steps, every = 300, 100
    common = ["--preset", "andrea-12m", "--max-steps", str(steps), "--checkpoint-every", str(every)]
    common += ["--log-every", "10", "--compile", "on"]
    code_c, log_c = run(trainer(work / "continuous", cache, *common))
    code_s, log_s = run(trainer(work / "stopped", cache, *common), stop_at=r"step 150/")
    stopped = re.findall(r"checkpoint step_0*(\d+)\.bin written \(sigterm", log_s)
    code_r, log_r = run(trainer(work / "stopped", cache, *common))
    final = f"step_{steps:06d}.bin"
    exact = same_bytes(work / "continuous" / final, work / "stopped" / final)
    ok &= exact and code_c == code_s == code_r == 0 and bool(stopped)
    report += [
        "## SIGTERM and resume, andrea-12m (deterministic, compiled)",
        f"- exit codes: continuous {code_c}, stopped {code_s} (SIGTERM checkpoint at step "
        f"{stopped[0] if stopped else 'NONE'}), resumed {code_r}",
        f"- final {final} equal byte for byte to the uninterrupted run: **{'yes' if exact else 'NO'}**",
        f"- tokens/s (deterministic): {tok_s(log_c):.0f}",
        "",
    ]

    # 3. deterministic off, twice: speed, and whether the bits repeat
    off = [*common[:3], "150", *common[4:], "--deterministic", "off"]
    on = [*common[:3], "150", *common[4:], "--deterministic", "on"]
    code_1, log_1 = run(trainer(work / "nondet-1", cache, *off))
    code_2, _ = run(trainer(work / "nondet-2", cache, *off))
    code_3, log_3 = run(trainer(work / "det-1", cache, *on))
    code_4, _ = run(trainer(work / "det-2", cache, *on))
    code_5, log_5 = run(trainer(work / "eager", cache, *on[:-4], "--compile", "off", *on[-2:]))
    f150 = "step_000150.bin"
    rep_off = same_bytes(work / "nondet-1" / f150, work / "nondet-2" / f150)
    rep_on = same_bytes(work / "det-1" / f150, work / "det-2" / f150)
    ok &= rep_on and code_1 == code_2 == code_3 == code_4 == code_5 == 0
    speed_on, speed_off = tok_s(log_3), tok_s(log_1)
    report += [
        "## Deterministic mode, andrea-12m, 150 steps",
        "| mode | tokens/s | two runs bit-identical |",
        "|---|---:|---|",
        f"| off | {speed_off:.0f} | {'yes' if rep_off else 'no'} |",
        f"| on | {speed_on:.0f} | {'yes' if rep_on else 'NO'} |",
        f"- cost of the deterministic mode: {speed_off / speed_on:.2f}x the time per token",
        f"- eager (--compile off, deterministic on): {tok_s(log_5):.0f} tokens/s; compiled ÷ eager"
        f" throughput {speed_on / tok_s(log_5):.2f}",
        "",
    ]

    # 4. andrea-120m, bf16: throughput, checkpoint stall and write
    big = ["--preset", "andrea-120m", "--max-steps", "60", "--checkpoint-every", "20"]
    big += ["--log-every", "5", "--precision", "bf16"]
    code_b, log_b = run(trainer(work / "120m", cache, *big))
    stalls = [float(x) for x in re.findall(r"staged in ([\d.]+) s", log_b)]
    writes = [float(x) for x in re.findall(r"written \(cadence, [\d.]+ MB, ([\d.]+) s", log_b)]
    ok &= code_b == 0 and bool(stalls) and bool(writes)
    report += [
        "## andrea-120m, bf16 autocast",
        f"- tokens/s: {tok_s(log_b):.0f}",
        f"- checkpoint stall (staging copy training waits for): median "
        f"{1000 * statistics.median(stalls) if stalls else float('nan'):.0f} ms over {len(stalls)} checkpoints",
        f"- 120M write in the background (1.46 GB, fsync): median "
        f"{statistics.median(writes) if writes else float('nan'):.2f} s",
        "",
    ]
    lines, fits = activation_check()
    ok &= fits
    report += [
        *lines,
        f"Total {time.monotonic() - t_start:.0f} s. Overall: **{'PASS' if ok else 'FAIL'}**",
    ]
    text = "\n".join(report)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0 if ok else 1


def activation_check() -> tuple[list[str], bool]:
    """Plan's estimate of a step's activations (with autocast's bf16 weight copies, which plan
    counts beside them) against what the CUDA allocator measures above the model, its gradients
    and the batch: within 25%, as on CPU (tests/test_plan.py)."""
    import torch

    from andrea.control.sizing import activation_bytes, cuda_numerics, parameters
    from andrea.daemon import determinism
    from andrea.daemon.config import build_config
    from andrea.daemon.model import GPT

    model = build_config(overrides={"preset": "andrea-120m"}).model
    device = torch.device("cuda")
    gpt = GPT(model).to(device).train()
    p = parameters(model)
    copies = 2 * (p.n_params - p.embedding_params)
    lines = ["## Plan's activation estimate, andrea-120m, bf16", "| attention | sequences | "
             "estimate (GiB) | measured (GiB) | ratio |", "|---|---:|---:|---:|---:|"]  # fmt: skip
    ok = True

    def step(x: torch.Tensor, det: bool) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16), determinism.attention(det, device):
            logits, loss = gpt(x[:, :-1], x[:, 1:])
        loss.backward()
        del logits

    for det in (True, False):
        for seqs in (1, 8):
            x = torch.randint(0, model.vocab_size, (seqs, model.block_size + 1), device=device)
            step(x, det)  # the gradients exist from here on, as in training
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step(x, det)
            torch.cuda.synchronize()
            measured = torch.cuda.max_memory_allocated() - base
            estimate = activation_bytes(model, seqs, cuda_numerics("bf16", det)) + copies
            ratio = estimate / measured
            ok &= 0.75 <= ratio <= 1.25
            lines.append(f"| {'math' if det else 'fused'} | {seqs} | {estimate / 2**30:.2f} | "
                         f"{measured / 2**30:.2f} | {ratio:.2f} |")  # fmt: skip
    return [*lines, ""], ok


if __name__ == "__main__":
    sys.exit(main())
