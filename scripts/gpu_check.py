#!/usr/bin/env python3
"""Every CUDA path of andrea, on one GPU, in two calls of at most five minutes; a markdown report.

    python scripts/gpu_check.py --call speed [--out A.md] [--keep DIR] [--budget 290]
    python scripts/gpu_check.py --call exact [--out B.md] [--keep DIR] [--budget 290]
    python scripts/gpu_check.py --call speed --dry-run     # on CPU: every step that needs no CUDA

Call A (speed) — andrea-120m in bf16: tokens/s and MFU, compiled and eager, the deterministic mode
on and off, flash attention against the math backend; compile time and recompiles; peak memory
against `andreactl plan`'s estimate, and plan's activation estimate of one step against the
CUDA allocator's measured peak; the 1.46 GB checkpoint at a
cadence of 100 (how long training is held, the staging copy, the step after it, the write).
Call B (exact) — the CUDA unit tests; andrea-12m stopped by SIGTERM and resumed, eager and
compiled, against the run never stopped (the final .bin equal byte for byte), with the negative
control (a resume that skips the RNGs must differ); the deterministic mode on twice (the same
bytes) and off twice (reported).

Every figure comes from the trainer's own log lines. Each process runs under a real timeout (it is
killed when its time is up, whether or not it is logging), and the call as a whole keeps to
`--budget` seconds: a step that would overrun is cut and the report says so. The report starts
with the GPU, driver, CUDA, cuDNN, NCCL, torch and Python versions.

It needs only the project importable by this interpreter: on a bare GPU machine, the venv of
scripts/gpu_wheels.sh. With --dry-run the same steps run on the CPU with andrea-tiny (the CUDA
tests skip, the CUDA-only figures say so): a check of the check, within the same budget.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

#: Dense bf16 peak of the GPUs this is likely to meet, TFLOP/s (vendor data sheets).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 PCIe": 756.0}
PEAK_BF16_TFLOPS |= {"A100": 312.0, "L40S": 362.0, "L4": 121.0, "B200": 2250.0}


@dataclass
class Result:
    code: int | None
    log: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out


@dataclass
class Check:
    """One call: its work directory, the time left, the report and the verdict."""

    dry_run: bool
    work: Path
    cache: Path
    deadline: float
    lines: list[str] = field(default_factory=list)
    ok: bool = True

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def fail(self, why: str) -> None:
        self.ok = False
        self.add(f"- **FAIL**: {why}")

    def run(self, cmd: list[str], limit: float, stop_at: str | None = None, **env: str) -> Result:
        """`cmd` under a real timeout (the smaller of `limit` and what the call has left); SIGTERM
        at the first line of its output matching `stop_at`."""
        limit = min(limit, self.left() - 5)
        if limit <= 1:
            return Result(None, "not started: the call's budget is spent", 0.0, timed_out=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, **env},
            start_new_session=True,
        )
        lines: list[str] = []

        def pump() -> None:
            nonlocal stop_at
            for line in proc.stdout:
                lines.append(line)
                if stop_at and re.search(stop_at, line):
                    stop_at = None
                    proc.send_signal(signal.SIGTERM)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
        reader.join(timeout=5)
        return Result(code, "".join(lines), time.monotonic() - t0, timed_out)


def trainer(check: Check, run_dir: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "andrea-trainer"),
        "--run-dir",
        str(run_dir),
        "--device",
        check.device,
        "--cache-dir",
        str(check.cache),
        "--sample-every",
        "0",
        "--log-level",
        "DEBUG",
        *(["--threads", "2"] if check.dry_run else []),
        *extra,
    ]


def floats(pattern: str, log: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, log)]


def steady(values: list[float], skip: int = 1) -> float:
    """The median after the first `skip` (the compile and warm-up)."""
    rest = values[skip:] or values
    return statistics.median(rest) if rest else float("nan")


def same_bytes(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.read_bytes() == b.read_bytes()


# ---- the report's header -----------------------------------------------------------------------


def header(call: str, dry_run: bool) -> list[str]:
    import torch

    from andrea.daemon import cudaenv

    rows = [("torch", torch.__version__), ("Python", platform.python_version())]
    if torch.cuda.is_available():
        env = cudaenv.describe(torch.device("cuda", 0))
        rows = [
            ("GPU", f"{env['gpu']} (compute capability {env['compute_capability']})"),
            ("driver", env["cuda_driver"]),
            ("CUDA", env["cuda_runtime"]),
            ("cuDNN", env["cudnn"]),
            ("NCCL", env["nccl"]),
            *rows,
        ]
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    title = f"# GPU check, call {call}" + (" (dry run on the CPU: andrea-tiny)" if dry_run else "")
    return [
        title,
        "",
        *(f"- {k}: {v}" for k, v in rows),
        f"- code: {commit or 'unknown'}",
        "",
    ]


# ---- call A: speed and memory ------------------------------------------------------------------


def flops_per_token(preset: str) -> float:
    """Training FLOPs per token: 6 per weight of every matmul (forward and backward; the embedding
    lookups are not matmuls) plus causal attention's 6 L T d (PaLM, appendix B, halved for the
    mask)."""
    import torch

    from andrea.daemon.config import build_config
    from andrea.daemon.model import GPT

    m = build_config(overrides={"preset": preset}).model
    with torch.device("meta"):
        n = GPT(m).n_params()
    matmul = n - (m.vocab_size + m.block_size) * m.n_embd
    return 6 * matmul + 6 * m.n_layer * m.block_size * m.n_embd


def peak_tflops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def throughput(check: Check, name: str, preset: str, steps: int, *extra: str, **env: str) -> dict:
    """One run of `steps` steps: steady tokens/s and ms/step (every 10 steps), the first window's
    excess (compile), recompiles, peak memory, and the checkpoint lines."""
    r = check.run(
        trainer(check, check.work / name, "--preset", preset, "--max-steps", str(steps), *extra),
        limit=170,
        **env,
    )
    if not r.ok:
        check.fail(f"{name}: exit {r.code}{' (timed out)' if r.timed_out else ''}")
    ms = floats(r"\| ([\d.]+) ms/step \|", r.log)
    peak = re.search(r"peak CUDA memory: ([\d.]+) GiB allocated, ([\d.]+) GiB reserved", r.log)
    return {
        "ok": r.ok,
        "seconds": r.seconds,
        "tok_s": steady(floats(r"\| (\d+) tok/s \|", r.log)),
        "ms": steady(ms),
        "first_excess_s": (ms[0] - steady(ms)) * 10 / 1000 if len(ms) > 1 else float("nan"),
        "recompiles": r.log.count("Recompiling function"),
        "peak": (float(peak.group(1)), float(peak.group(2))) if peak else None,
        "held": floats(r"handed over in ([\d.]+) s", r.log),
        "staged": floats(r"staged in ([\d.]+) s\)", r.log),
        "written": floats(r"written \(cadence, [\d.]+ MB, ([\d.]+) s in the background", r.log),
        "after": floats(r"the first after the checkpoint of step \d+: ([\d.]+) ms", r.log),
        "before": floats(
            r"the first after the checkpoint of step \d+: [\d.]+ ms \(step \d+: ([\d.]+) ms", r.log
        ),
    }


def plan_estimate(preset: str) -> str:
    """What `andreactl plan` estimates a GPU of this machine needs for the preset."""
    import json

    res = subprocess.run(
        [str(BIN / "andreactl"), "plan", "--preset", preset, "--gpus", "1", "--json"],
        capture_output=True,
        text=True,
    )
    try:
        memory = json.loads(res.stdout)["memory"]
    except (ValueError, KeyError):
        return f"no estimate (andreactl plan exited {res.returncode})"
    return (
        f"{memory['total'] / 2**30:.2f} GiB in all, of which activations "
        f"{memory['activations'] / 2**30:.2f} GiB"
    )


def activation_check(check: Check) -> None:
    """`andreactl plan`'s estimate of a step's activations (with autocast's bf16 weight copies,
    which plan counts beside them) against what the CUDA allocator measures above the model, its
    gradients and the batch, deterministic mode on and off (both fused attention now): within
    25 %, as on CPU (tests/test_plan.py)."""
    import torch

    from andrea.control.sizing import activation_bytes, cuda_numerics, parameters
    from andrea.daemon import determinism
    from andrea.daemon.config import build_config
    from andrea.daemon.model import GPT

    check.add("## Plan's activation estimate, andrea-120m, bf16", "")
    if check.dry_run:
        check.add("Needs CUDA: not run in a dry run.", "")
        return
    model = build_config(overrides={"preset": "andrea-120m"}).model
    device = torch.device("cuda")
    gpt = GPT(model).to(device).train()
    p = parameters(model)
    copies = 2 * (p.n_params - p.embedding_params)
    check.add("| deterministic | sequences | estimate GiB | measured GiB | ratio |")
    check.add("|---|---:|---:|---:|---:|")

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
            estimate = activation_bytes(model, seqs, cuda_numerics("bf16")) + copies
            ratio = estimate / measured
            check.add(
                f"| {'on' if det else 'off'} | {seqs} | {estimate / 2**30:.2f} | "
                f"{measured / 2**30:.2f} | {ratio:.2f} |"
            )
            if not 0.75 <= ratio <= 1.25:
                check.fail(f"plan's activation estimate is {ratio:.2f} x the measured peak")
    check.add("")


def call_speed(check: Check) -> None:
    big = "andrea-tiny" if check.dry_run else "andrea-120m"
    bf16 = [] if check.dry_run else ["--precision", "bf16"]
    quiet = ["--log-every", "10", "--checkpoint-every", "0", "--eval-every", "0", *bf16]
    # Compiling takes minutes on a 2-core CPU: the dry run checks the same steps eagerly.
    compile_ = "off" if check.dry_run else "on"
    compiled = throughput(
        check,
        "compiled",
        big,
        150,
        "--log-every",
        "10",
        "--checkpoint-every",
        "100",
        "--eval-every",
        "0",
        "--compile",
        compile_,
        *bf16,
        TORCH_LOGS="recompiles",
    )
    label = (
        "eager (a dry run), deterministic, flash"
        if check.dry_run
        else "compiled, deterministic, flash"
    )
    runs = {label: compiled}
    runs["eager, deterministic, flash"] = throughput(check, "eager-det", big, 40, *quiet)
    runs["eager, not deterministic, flash"] = throughput(
        check, "eager-nondet", big, 40, *quiet, "--deterministic", "off"
    )
    runs["eager, deterministic, math attention"] = throughput(
        check, "eager-math", big, 40, *quiet, ANDREA_BENCH_SDPA_BACKENDS="MATH"
    )
    report_speed(check, big, runs)
    activation_check(check)


def report_speed(check: Check, preset: str, runs: dict[str, dict]) -> None:
    """The table of `runs`; the first is the one with the compile and the checkpoint."""
    per_token, peak = flops_per_token(preset), peak_tflops()
    check.add(f"## Speed: {preset}, {'fp32 on the CPU' if check.dry_run else 'bf16 autocast'}", "")
    check.add("| run | tokens/s | ms/step | MFU | seconds |", "|---|---:|---:|---:|---:|")
    for name, x in runs.items():
        mfu = f"{100 * x['tok_s'] * per_token / (peak * 1e12):.1f} %" if peak else "n/a"
        check.add(f"| {name} | {x['tok_s']:.0f} | {x['ms']:.1f} | {mfu} | {x['seconds']:.0f} |")
    base = runs["eager, deterministic, flash"]["tok_s"]
    for name, x in runs.items():
        check.add(f"- {name}: {x['tok_s'] / base:.2f} × the eager deterministic flash run")
    c = next(iter(runs.values()))
    peak_mem = (
        f"{c['peak'][0]:.2f} GiB allocated, {c['peak'][1]:.2f} reserved" if c["peak"] else "n/a"
    )
    check.add(
        "",
        f"- compile: about {c['first_excess_s']:.0f} s (the first 10 steps' excess); "
        f"{c['recompiles']} recompiles",
        f"- peak memory (compiled run): {peak_mem}; andreactl plan: {plan_estimate(preset)}",
        f"- checkpoint at step 100: training held {1000 * max(c['held'], default=float('nan')):.1f} ms,"
        f" staging copy {1000 * max(c['staged'], default=float('nan')):.0f} ms,"
        f" the step after it {max(c['after'], default=float('nan')):.1f} ms"
        f" (the step before it {max(c['before'], default=float('nan')):.1f} ms),"
        f" write in the background {max(c['written'], default=float('nan')):.2f} s",
        "",
    )
    if not c["written"]:
        check.fail("no cadence checkpoint was written")


# ---- call B: exactness -------------------------------------------------------------------------


def unit_tests(check: Check) -> None:
    tests = ["tests/test_determinism.py", "tests/test_step_batches.py"]
    tests.append("tests/test_distributed_units.py")
    r = check.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests], 120
    )
    summary = r.log.strip().splitlines()[-1] if r.log.strip() else "(no output)"
    check.add("## CUDA unit tests", "", f"`pytest {' '.join(tests)}`: {summary}", "")
    if not r.ok or (not check.dry_run and "skipped" in summary):
        check.fail("the CUDA unit tests did not all run and pass")


def resume_args(preset: str, steps: int, compile_: str | None) -> list[str]:
    args = ["--preset", preset, "--max-steps", str(steps), "--log-every", "10"]
    args += ["--checkpoint-every", str(steps // 2), "--deterministic", "on"]
    return args + (["--compile", compile_] if compile_ else [])


def resume(check: Check, name: str, preset: str, steps: int, *extra: str) -> dict:
    """`name`: a run never stopped, one stopped by SIGTERM at step ~steps/2 and resumed, and (when
    there is time) the negative control, the same stop resumed without its RNG states."""
    common = [*resume_args(preset, steps, None), *extra]
    final = f"step_{steps:06d}.bin"
    whole, stopped = check.work / f"{name}-whole", check.work / f"{name}-stopped"
    codes = [check.run(trainer(check, whole, *common), 150).code]
    r = check.run(trainer(check, stopped, *common), 150, stop_at=rf"step {steps // 2 - 10}/")
    at = re.findall(r"checkpoint step_0*(\d+)\.bin written \(sigterm", r.log)
    codes.append(r.code)
    control = check.work / f"{name}-control"
    if stopped.exists():
        subprocess.run(["cp", "-r", str(stopped), str(control)], check=True)
    codes.append(check.run(trainer(check, stopped, *common), 150).code)
    out = {
        "codes": codes,
        "at": at[0] if at else None,
        "exact": same_bytes(whole / final, stopped / final),
    }
    if check.left() > 60 and control.exists():
        c = check.run(trainer(check, control, *common, "--unsafe-skip-restore", "rng"), 150)
        out["control_differs"] = c.code == 0 and not same_bytes(whole / final, control / final)
    return out


def repeat(check: Check, name: str, preset: str, steps: int, *extra: str) -> bool | None:
    """Two fresh runs alike: the same final bytes? (None: a run failed or was cut.)"""
    args = ["--preset", preset, "--max-steps", str(steps), "--log-every", "10", *extra]
    runs = [check.run(trainer(check, check.work / f"{name}-{i}", *args), 120) for i in (1, 2)]
    if not all(r.ok for r in runs):
        return None
    final = f"step_{steps:06d}.bin"
    return same_bytes(check.work / f"{name}-1" / final, check.work / f"{name}-2" / final)


def call_exact(check: Check) -> None:
    unit_tests(check)
    mid = "andrea-tiny" if check.dry_run else "andrea-12m"
    check.add(f"## SIGTERM and resume, {mid}, deterministic mode on", "")
    check.add("| mode | exit codes | stopped at | final .bin equal | RNG-skipping resume differs |")
    check.add("|---|---|---|---|---|")
    # Compiling takes minutes on a 2-core CPU: the dry run resumes eagerly only.
    modes = [("eager", "off")] + ([] if check.dry_run else [("compiled", "on")])
    for mode, compile_ in modes:
        x = resume(check, mode, mid, 60, "--compile", compile_)
        differs = x.get("control_differs")
        check.add(
            f"| {mode} | {x['codes']} | {x['at']} | {'yes' if x['exact'] else '**NO**'} | "
            f"{'not run (budget)' if differs is None else 'yes' if differs else '**NO**'} |"
        )
        if not x["exact"] or x["codes"] != [0, 0, 0] or differs is False:
            check.fail(f"{mode}: the resume is not bit-exact, or the negative control passed")
    # A second fresh run of the eager one never stopped: the same bytes?
    again = check.run(trainer(check, check.work / "eager-again", *resume_args(mid, 60, "off")), 120)
    final = "step_000060.bin"
    same_on = again.ok and same_bytes(
        check.work / "eager-whole" / final, check.work / "eager-again" / final
    )
    same_off = (
        None if check.dry_run else repeat(check, "det-off", mid, 40, "--deterministic", "off")
    )
    words = {True: "yes", False: "**no**", None: "not run (GPU only)"}
    check.add(
        "",
        f"- deterministic mode on, a second fresh eager run bit-identical: {'yes' if same_on else '**NO**'}",
        f"- deterministic mode off, two fresh compiled runs bit-identical: {words[same_off]}",
        "",
    )
    if not same_on:
        check.fail("two deterministic runs differ (or the second did not run)")


# ---- the command line --------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--call", choices=["speed", "exact"], required=True, help="A: speed; B: exact")
    p.add_argument("--out", type=Path, help="write the markdown report here too")
    p.add_argument(
        "--keep", type=Path, help="a new directory for the run directories (default: temporary)"
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "andrea-gpu-check-cache",
        help="the tokenized corpus, built by the first call and kept for the next",
    )
    p.add_argument("--budget", type=float, default=290, help="seconds for the whole call")
    p.add_argument("--dry-run", action="store_true", help="on the CPU, andrea-tiny")
    a = p.parse_args()
    import torch

    if not a.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU visible (use --dry-run to check the check on the CPU)", file=sys.stderr)
        return 2
    if a.keep is not None and a.keep.exists() and any(a.keep.iterdir()):
        print(f"{a.keep} is not empty: runs there would be resumed", file=sys.stderr)
        return 2
    work = a.keep or Path(tempfile.mkdtemp(prefix="andrea-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(a.dry_run, work, a.cache, time.monotonic() + a.budget)
    check.add(*header("A (speed)" if a.call == "speed" else "B (exact)", a.dry_run))
    (call_speed if a.call == "speed" else call_exact)(check)
    spent = a.budget - check.left()
    check.add(
        f"Call took {spent:.0f} s of its {a.budget:.0f} s. Overall: **{'PASS' if check.ok else 'FAIL'}**"
    )
    text = "\n".join(check.lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
