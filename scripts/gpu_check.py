#!/usr/bin/env python3
"""Every CUDA path of andrea, on one GPU, in one call: install, speed, exactness; a markdown report.

    python3 scripts/gpu_check.py --report-dir DIR [--wheelhouse WH] [--keep DIR]
                                 [--budget 470] [--install-budget 90] [--speed-budget 240]
                                 [--exact-budget 130] [--sections install,speed,exact]
    python3 scripts/gpu_check.py --report-dir DIR --wheelhouse WH --dry-run    # on the CPU

Install — the wheels of scripts/gpu_wheels.sh and this checkout, with
`pip install --no-index --no-deps --target DIR/site` beside this interpreter's own torch (on the GPU
machine python3 is itself a venv's interpreter: a venv made from it would see the base
interpreter's packages, not its torch), then DIR/site on PYTHONPATH for every child.
Speed — andrea-120m in bf16: tokens/s and MFU, compiled and eager (`--compile off`), the
deterministic mode on and off, flash attention against the math backend; compile time and
recompiles; peak memory against `andreactl plan`'s estimate, and plan's activation estimate of one
step against the CUDA allocator's measured peak (a miss is a warning: never measured before); the
1.46 GB checkpoint at a cadence of 100 (how long training is held, the staging copy, the step
after it, the write).
Exact — the CUDA unit tests; andrea-12m stopped by SIGTERM and resumed, eager and compiled, against
the run never stopped (the final .bin equal byte for byte), with the negative control (a resume
that skips the RNGs must differ); the deterministic mode on twice (the same bytes) and off twice
(reported).

Each section has its own budget, and the call as a whole keeps to `--budget` seconds: every
process runs under a real timeout (killed when its time is up, whether or not it is logging), and a
step that would overrun is cut and the report says so. DIR/report.md is rewritten at every line,
so a call cut short still leaves what ran; a failed child's last 40 log lines go into it. The
compile caches (Inductor, Triton) live in the call's work directory, shared by its children.
Children run without systemd's variables (INVOCATION_ID, JOURNAL_STREAM, NOTIFY_SOCKET), which
would send their logs to the journal instead of to this check.

With --dry-run the same steps run on the CPU with andrea-tiny, eagerly (the CUDA tests skip, the
CUDA-only figures say so): a check of the check; scripts/gpu_rehearsal.sh runs it in CI.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
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

#: Dense bf16 peak of the GPUs this is likely to meet, TFLOP/s (vendor data sheets).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 80GB HBM3": 989.0, "H100 PCIe": 756.0}
PEAK_BF16_TFLOPS |= {"A100": 312.0, "L40S": 362.0, "L4": 121.0, "B200": 2250.0}

#: Under these a daemon logs to the journal (daemon/runtime/operator_requests.py) and signals systemd: a child of
#: the check must log to its pipe.
SYSTEMD_VARS = ("INVOCATION_ID", "JOURNAL_STREAM", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")

#: How much of a failed child's log the report keeps.
TAIL_LINES = 40

#: Steps of each kind of run: (on the GPU, in a dry run). A dry run keeps every step of the check,
#: short enough for CI's two cores.
STEPS = {"compiled": (150, 30), "eager": (40, 12), "resume": (60, 40), "repeat": (40, 12)}
#: The cadence of the compiled run's checkpoint.
CADENCE = (100, 20)


def steps(check: Check, kind: str) -> int:
    return STEPS[kind][check.dry_run]


SECTIONS = ("install", "speed", "exact")


@dataclass
class Result:
    code: int | None
    log: str
    seconds: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.code == 0 and not self.timed_out

    def tail(self, n: int = TAIL_LINES) -> list[str]:
        return self.log.rstrip("\n").splitlines()[-n:]


@dataclass
class Check:
    """One call: its work directory, the time left, the report (rewritten at every line into
    `report_dir`) and the verdict."""

    dry_run: bool
    work: Path
    cache: Path
    deadline: float
    report_dir: Path | None = None
    lines: list[str] = field(default_factory=list)
    ok: bool = True
    warnings: int = 0
    section_deadline: float = float("inf")
    env: dict[str, str] = field(default_factory=dict)

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    def left(self) -> float:
        return min(self.deadline, self.section_deadline) - time.monotonic()

    def section(self, title: str, budget: float) -> None:
        """A new section of the report, with `budget` seconds of its own (within the call's)."""
        self.section_deadline = time.monotonic() + budget
        self.add(f"## {title}", "", f"_budget: {budget:.0f} s_", "")

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)
        for line in lines:
            print(line, flush=True)
        if self.report_dir is not None:
            tmp = self.report_dir / "report.md.tmp"
            tmp.write_text("\n".join(self.lines) + "\n")
            tmp.replace(self.report_dir / "report.md")

    def fail(self, why: str, result: Result | None = None) -> None:
        """A failure, with the last lines of the child's log when there is one."""
        self.ok = False
        self.add(f"- **FAIL**: {why}")
        if result is not None:
            self.add(f"  last {TAIL_LINES} lines of its log:", "", "```", *result.tail(), "```", "")

    def warn(self, why: str) -> None:
        self.warnings += 1
        self.add(f"- **WARNING**: {why}")

    def child_env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in SYSTEMD_VARS}
        return {**env, **self.env, **extra}

    def run(self, cmd: list[str], limit: float, stop_at: str | None = None, **env: str) -> Result:
        """`cmd` under a real timeout (the smaller of `limit` and what the call has left); SIGTERM
        at the first line of its output matching `stop_at`."""
        limit = min(limit, self.left() - 5)
        if limit <= 1:
            return Result(None, "not started: the budget is spent", 0.0, timed_out=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env=self.child_env(**env),
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

    def expect(self, name: str, r: Result) -> bool:
        """Fail with the child's log tail unless `r` exited 0 in time."""
        if not r.ok:
            self.fail(f"{name}: exit {r.code}{' (timed out)' if r.timed_out else ''}", r)
        return r.ok


def trainer(check: Check, run_dir: Path, *extra: str) -> list[str]:
    """The trainer as a module of this interpreter: the install has no console scripts to rely on."""
    return [
        sys.executable,
        "-m",
        "andrea.daemon.trainer.service.cli",
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


# ---- install -----------------------------------------------------------------------------------


def pip_target(check: Check, site: Path, *what: str, limit: float) -> Result:
    """`pip install --no-index --no-deps --target site`: nothing fetched, nothing of this
    interpreter's (its torch above all) replaced."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    cmd += ["--root-user-action=ignore"]
    cmd += ["--no-index", "--no-deps", "--no-build-isolation", "--target", str(site), *what]
    return check.run(cmd, limit)


def use_site(check: Check, site: Path) -> None:
    """`site` first on this process's path and on every child's PYTHONPATH."""
    sys.path.insert(0, str(site))
    check.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p
    )


#: What the install must make importable, and whence: torch from the interpreter, the rest from
#: the site directory.
IMPORT_CHECK = """
import sys, torch, pydantic, zmq, tomli_w, tensorboardX, crc32c, zstandard, andrea.daemon.trainer
site = sys.argv[1]
if site:
    assert not torch.__file__.startswith(site), f"torch came from {site}: {torch.__file__}"
    for m in (pydantic, zmq, andrea.daemon.trainer):
        assert m.__file__.startswith(site), f"{m.__name__} is not the installed one: {m.__file__}"
print(f"torch {torch.__version__} from {torch.__file__}; andrea from {andrea.daemon.__file__}")
"""


def install(check: Check, wheelhouse: Path | None, site: Path) -> None:
    """The wheelhouse and this checkout into `site`, an import check in a fresh child, then
    systemd-python's source, built only where a compiler is and time is left (optional)."""
    installed = ""
    if wheelhouse is None:
        check.add("No --wheelhouse: the project must be importable by this interpreter already.")
    else:
        wheels = sorted(str(w) for w in wheelhouse.glob("*.whl"))
        check.add(f"`pip install --no-index --no-deps --target {site}`: {len(wheels)} wheels + .")
        if not check.expect("install", pip_target(check, site, *wheels, str(REPO), limit=120)):
            return
        use_site(check, site)
        installed = str(site)
    r = check.run([sys.executable, "-c", IMPORT_CHECK, installed], 60)
    if check.expect("import check", r):
        check.add(f"- {r.tail(1)[0] if r.tail(1) else ''}")
    sources = sorted(wheelhouse.glob("systemd*.tar.gz")) if wheelhouse else []
    if sources and shutil.which("cc") and check.left() > 45:
        built = pip_target(check, site, *map(str, sources), limit=check.left() - 20).ok
    else:
        built = False
    check.add(f"- systemd-python: {'built' if built else 'not built: notifications off'}", "")


# ---- the report's header -----------------------------------------------------------------------


def code_version() -> str:
    """The checkout's commit, or why it is unknown: a bare machine may have no git."""
    git = shutil.which("git")
    if git is None:
        return "unknown (no git on this machine)"
    try:
        r = subprocess.run(
            [git, "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    return r.stdout.strip() or "unknown (not a git checkout)"


def gpu_rows(env: dict[str, str | None]) -> list[tuple[str, str | None]]:
    """The report's rows of cudaenv.describe's fields."""
    return [
        ("GPU", f"{env['gpu']} (compute capability {env['compute_capability']})"),
        ("driver", env["cuda_driver"]),
        ("CUDA", env["cuda_runtime"]),
        ("cuDNN", env["cudnn"]),
        ("NCCL", env["nccl"]),
    ]


def header(dry_run: bool) -> list[str]:
    import torch

    from andrea.daemon.trainer.platform import cudaenv

    rows = [("torch", torch.__version__), ("Python", platform.python_version())]
    if torch.cuda.is_available():
        rows = [*gpu_rows(cudaenv.describe(torch.device("cuda", 0))), *rows]
    return [*(f"- {k}: {v}" for k, v in rows), f"- code: {code_version()}", ""]


# ---- speed and memory ------------------------------------------------------------------------


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
    return peak_of(torch.cuda.get_device_name(0))


def peak_of(name: str) -> float | None:
    """The dense bf16 peak (TFLOP/s) of the GPU `name` names, as torch.cuda.get_device_name gives
    it; None for a model not in PEAK_BF16_TFLOPS (the report then gives no MFU). The longest key
    found wins, so that "L4" never stands for an L40S, whatever the table's order."""
    key = max((k for k in PEAK_BF16_TFLOPS if k in name), key=len, default=None)
    return None if key is None else PEAK_BF16_TFLOPS[key]


def throughput(check: Check, name: str, preset: str, steps: int, *extra: str, **env: str) -> dict:
    """One run of `steps` steps: steady tokens/s and ms/step (every 10 steps), the first window's
    excess (compile), recompiles, peak memory, and the checkpoint lines."""
    r = check.run(
        trainer(check, check.work / name, "--preset", preset, "--max-steps", str(steps), *extra),
        limit=170,
        **env,
    )
    check.expect(name, r)
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


def plan_estimate(check: Check, preset: str) -> str:
    """What `andreactl plan` estimates a GPU of this machine needs for the preset."""
    import json

    cmd = [sys.executable, "-m", "andrea.control.andreactl", "plan", "--preset", preset]
    res = check.run([*cmd, "--gpus", "1", "--json"], 60)
    try:
        memory = json.loads(res.log)["memory"]
    except (ValueError, KeyError):
        return f"no estimate (andreactl plan exited {res.code})"
    return (
        f"{memory['total'] / 2**30:.2f} GiB in all, of which activations "
        f"{memory['activations'] / 2**30:.2f} GiB"
    )


def activation_check(check: Check) -> None:
    """`andreactl plan`'s estimate of a step's activations (with autocast's bf16 weight copies,
    which plan counts beside them) against what the CUDA allocator measures above the model, its
    gradients and the batch, deterministic mode on and off (both fused attention now): within
    25 %, as on CPU (tests/unit/test_plan.py)."""
    import torch

    from andrea.control.sizing import activation_bytes, cuda_numerics, parameters
    from andrea.daemon.config import build_config
    from andrea.daemon.model import GPT
    from andrea.daemon.trainer.platform import determinism

    check.add("### Plan's activation estimate, andrea-120m, bf16", "")
    if check.dry_run:
        check.add("Needs CUDA: not run in a dry run.", "")
        return
    model = build_config(overrides={"preset": "andrea-120m"}).model
    device = torch.device("cuda")
    gpt = GPT(model).to(device).train()
    p = parameters(model)
    copies = 2 * (p.n_params - p.embedding_params)
    rows: list[tuple[str, float]] = []

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
            rows.append(activation_row(det, seqs, estimate, measured))
    activation_verdict(check, rows)


def activation_row(det: bool, seqs: int, estimate: int, measured: int) -> tuple[str, float]:
    """One row of the table, and estimate / measured."""
    ratio = estimate / measured if measured > 0 else float("inf")
    row = (
        f"| {'on' if det else 'off'} | {seqs} | {estimate / 2**30:.2f} | "
        f"{measured / 2**30:.2f} | {ratio:.2f} |"
    )
    return row, ratio


def activation_verdict(check: Check, rows: list[tuple[str, float]]) -> None:
    """The table; a ratio outside 0.75–1.25 is a warning, not a failure: the estimate has never
    been measured on a GPU, and the first run is what measures it."""
    check.add("| deterministic | sequences | estimate GiB | measured GiB | ratio |")
    check.add("|---|---:|---:|---:|---:|", *(row for row, _ in rows), "")
    for row, ratio in rows:
        if not 0.75 <= ratio <= 1.25:
            check.warn(f"plan's activation estimate is {ratio:.2f} x the measured peak ({row})")
    check.add("")


def call_speed(check: Check) -> None:
    big = "andrea-tiny" if check.dry_run else "andrea-120m"
    bf16 = [] if check.dry_run else ["--precision", "bf16"]
    n, every = steps(check, "eager"), CADENCE[check.dry_run]
    # Eager means eager: `compile = auto` is on under CUDA. The deterministic mode is named, not
    # left to `auto` (off on the CPU), so that a dry run takes the same path.
    quiet = ["--log-every", "10", "--checkpoint-every", "0", "--eval-every", "0", *bf16]
    eager = [*quiet, "--compile", "off", "--deterministic"]
    # Compiling takes minutes on a 2-core CPU: the dry run checks the same steps eagerly.
    compiled = throughput(
        check,
        "compiled",
        big,
        steps(check, "compiled"),
        *quiet,
        "--checkpoint-every",
        str(every),
        "--deterministic",
        "on",
        "--compile",
        "off" if check.dry_run else "on",
        TORCH_LOGS="recompiles",
    )
    label = "compiled, deterministic, flash"
    runs = {label + (" (eager in a dry run)" if check.dry_run else ""): compiled}
    runs["eager, deterministic, flash"] = throughput(check, "eager-det", big, n, *eager, "on")
    runs["eager, not deterministic, flash"] = throughput(
        check, "eager-nondet", big, n, *eager, "off"
    )
    runs["eager, deterministic, math attention"] = throughput(
        check, "eager-math", big, n, *eager, "on", ANDREA_BENCH_SDPA_BACKENDS="MATH"
    )
    report_speed(check, big, runs, every)
    activation_check(check)


def report_speed(check: Check, preset: str, runs: dict[str, dict], every: int) -> None:
    """The table of `runs`; the first is the one with the compile and the checkpoint."""
    per_token, peak = flops_per_token(preset), peak_tflops()
    check.add(f"### Speed: {preset}, {'fp32 on the CPU' if check.dry_run else 'bf16 autocast'}", "")
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
        f"- peak memory (compiled run): {peak_mem}; andreactl plan: {plan_estimate(check, preset)}",
        f"- checkpoint at step {every}: training held {1000 * max(c['held'], default=float('nan')):.1f} ms,"
        f" staging copy {1000 * max(c['staged'], default=float('nan')):.0f} ms,"
        f" the step after it {max(c['after'], default=float('nan')):.1f} ms"
        f" (the step before it {max(c['before'], default=float('nan')):.1f} ms),"
        f" write in the background {max(c['written'], default=float('nan')):.2f} s",
        "",
    )
    if not c["written"]:
        check.fail("no cadence checkpoint was written")


# ---- exactness -------------------------------------------------------------------------------


def unit_tests(check: Check) -> None:
    tests = ["tests/unit/test_determinism.py", "tests/unit/test_step_batches.py"]
    tests += ["tests/unit/test_distributed_units.py", "tests/unit/test_recompute.py"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    r = check.run([*cmd, "-p", "no:randomly", *tests], 120)
    summary = r.tail(1)[0] if r.tail(1) else "(no output)"
    check.add("### CUDA unit tests", "", f"`pytest {' '.join(tests)}`: {summary}", "")
    if not r.ok or (not check.dry_run and "skipped" in summary):
        check.fail("the CUDA unit tests did not all run and pass", r)


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
    runs = [check.run(trainer(check, whole, *common), 150)]
    r = check.run(trainer(check, stopped, *common), 150, stop_at=rf"step {steps // 2 - 10}/")
    at = re.findall(r"checkpoint step_0*(\d+)\.bin written \(sigterm", r.log)
    runs.append(r)
    control = check.work / f"{name}-control"
    if stopped.exists():
        subprocess.run(["cp", "-r", str(stopped), str(control)], check=True)
    runs.append(check.run(trainer(check, stopped, *common), 150))
    for label, run in zip(("never stopped", "stopped", "resumed"), runs):
        check.expect(f"{name}, {label}", run)
    out = {
        "codes": [run.code for run in runs],
        "at": at[0] if at else None,
        "exact": same_bytes(whole / final, stopped / final),
    }
    if check.left() > max(run.seconds for run in runs) + 10 and control.exists():
        c = check.run(trainer(check, control, *common, "--unsafe-skip-restore", "rng"), 150)
        check.expect(f"{name}, negative control", c)
        out["control_differs"] = c.code == 0 and not same_bytes(whole / final, control / final)
    return out


def repeat(check: Check, name: str, preset: str, steps: int, *extra: str) -> bool | None:
    """Two fresh runs alike: the same final bytes? (None: a run failed or was cut.)"""
    args = ["--preset", preset, "--max-steps", str(steps), "--log-every", "10", *extra]
    runs = [check.run(trainer(check, check.work / f"{name}-{i}", *args), 120) for i in (1, 2)]
    if not all([check.expect(f"{name}-{i}", r) for i, r in enumerate(runs, 1)]):
        return None
    final = f"step_{steps:06d}.bin"
    return same_bytes(check.work / f"{name}-1" / final, check.work / f"{name}-2" / final)


def call_exact(check: Check) -> None:
    unit_tests(check)
    mid = "andrea-tiny" if check.dry_run else "andrea-12m"
    n = steps(check, "resume")
    check.add(f"### SIGTERM and resume, {mid}, deterministic mode on", "")
    check.add("| mode | exit codes | stopped at | final .bin equal | RNG-skipping resume differs |")
    check.add("|---|---|---|---|---|")
    # Compiling takes minutes on a 2-core CPU: the dry run resumes eagerly only.
    modes = [("eager", "off")] + ([] if check.dry_run else [("compiled", "on")])
    for mode, compile_ in modes:
        x = resume(check, mode, mid, n, "--compile", compile_)
        differs = x.get("control_differs")
        check.add(
            f"| {mode} | {x['codes']} | {x['at']} | {'yes' if x['exact'] else '**NO**'} | "
            f"{'not run (budget)' if differs is None else 'yes' if differs else '**NO**'} |"
        )
        if not x["exact"] or x["codes"] != [0, 0, 0] or differs is False:
            check.fail(f"{mode}: the resume is not bit-exact, or the negative control passed")
    # A second fresh run of the eager one never stopped: the same bytes?
    again = check.run(trainer(check, check.work / "eager-again", *resume_args(mid, n, "off")), 120)
    final = f"step_{n:06d}.bin"
    same_on = check.expect("eager, a second fresh run", again) and same_bytes(
        check.work / "eager-whole" / final, check.work / "eager-again" / final
    )
    same_off = (
        None
        if check.dry_run
        else repeat(check, "det-off", mid, steps(check, "repeat"), "--deterministic", "off")
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


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--report-dir", type=Path, required=True, help="report.md is written here")
    p.add_argument("--wheelhouse", type=Path, help="scripts/gpu_wheels.sh's wheels, to install")
    p.add_argument("--keep", type=Path, help="a new directory for the work (default: temporary)")
    p.add_argument(
        "--cache", type=Path, help="the tokenized corpus (default: built in the work directory)"
    )
    p.add_argument("--budget", type=float, default=470, help="seconds for the whole call")
    p.add_argument("--install-budget", type=float, default=90, help="seconds for the install")
    p.add_argument("--speed-budget", type=float, default=240, help="seconds for the speed runs")
    p.add_argument("--exact-budget", type=float, default=130, help="seconds for exactness")
    p.add_argument("--sections", default=",".join(SECTIONS), help="which, in this order")
    p.add_argument("--dry-run", action="store_true", help="on the CPU, andrea-tiny")
    a = p.parse_args(argv)
    a.sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    if unknown := set(a.sections) - set(SECTIONS):
        p.error(f"--sections: unknown {', '.join(sorted(unknown))} (known: {', '.join(SECTIONS)})")
    return a


def start(a: argparse.Namespace) -> Check | None:
    """The call's Check, its caches in its work directory; None when it cannot start."""
    import torch

    if not a.dry_run and not torch.cuda.is_available():
        print("no CUDA GPU visible (use --dry-run to check the check on the CPU)", file=sys.stderr)
        return None
    if a.keep is not None and a.keep.exists() and any(a.keep.iterdir()):
        print(f"{a.keep} is not empty: runs there would be resumed", file=sys.stderr)
        return None
    work = a.keep or Path(tempfile.mkdtemp(prefix="andrea-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    a.report_dir.mkdir(parents=True, exist_ok=True)
    corpus = a.cache or work / "corpus"
    check = Check(a.dry_run, work, corpus, time.monotonic() + a.budget, a.report_dir)
    # Compile caches kept for the whole call, shared by its children (the exactness section's
    # compiled runs reuse what the first one compiled).
    check.env["TORCHINDUCTOR_CACHE_DIR"] = str(work / "inductor-cache")
    check.env["TRITON_CACHE_DIR"] = str(work / "triton-cache")
    return check


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    check = start(a)
    if check is None:
        return 2
    t0 = time.monotonic()
    title = "# GPU check" + (" (dry run on the CPU: andrea-tiny)" if a.dry_run else "")
    check.add(title, "", f"- sections: {', '.join(a.sections)}; work: {check.work}", "")
    if "install" in a.sections:
        check.section("Install", a.install_budget)
        install(check, a.wheelhouse, check.work / "site")
    if check.ok:
        check.section("Machine", 10)
        check.add(*header(a.dry_run))
        runs = {"speed": ("Speed", a.speed_budget, call_speed)}
        runs["exact"] = ("Exactness", a.exact_budget, call_exact)
        for name in (s for s in a.sections if s in runs):
            title, budget, body = runs[name]
            check.section(title, budget)
            body(check)
    verdict = "PASS" if check.ok else "FAIL"
    warned = f" ({check.warnings} warnings)" if check.warnings else ""
    check.add(f"Call took {time.monotonic() - t0:.0f} s of its {a.budget:.0f} s. ")
    check.add(f"Overall: **{verdict}**{warned}")
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
