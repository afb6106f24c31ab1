"""torchrun + DDP on CPU with gloo, 2 ranks: real `torchrun` agents, real worker processes, real
signals and sockets.

Every scenario is short (a few dozen steps of andrea-tiny, one thread per rank), with two
micro-batches a step (gradients synchronised on the last one only). The reference is a run that
was never stopped, in fresh processes; comparisons are of bytes (the final .bin: weights, m, v)
and of the canonical loss curve. A job start costs far more than its steps (torch's import in the
agent and in every rank), so one stopped and resumed job is checked for several things.

SIGUSR1 to rank 0, `andreactl status` and `andreactl stop --wait` of a torchrun job are tested
on the FSDP job of tests/process/test_fsdp.py (the same signal and control path), and SIGTERM to
one rank on its 2-rank FSDP job.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon
from tests.support.distributed import BIN, STEPS, job, torchrun
from tests.support.manifests import final_trigger_is

#: Two micro-batches a step in every job here (DDP's no_sync on the first).
ACCUM = ("--grad-accum", "2")


def rank_pids(t: Daemon, n: int = 2) -> dict[int, int]:
    pids: dict[int, int] = {}
    while len(pids) < n:
        m = t.wait_for(r"rank (\d+) of \d+ \(node \d+, local rank \d+, pid (\d+)\)")
        pids[int(m.group(1))] = int(m.group(2))
    return pids


def ctl(run_dir: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "andreactl"), "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def curve(run_dir: Path) -> list[tuple[int, float, str]]:
    return [(e.step, e.loss, e.arm) for e in canonical_curve(read_entries(run_dir / ".loss.json"))]


def manifests(run_dir: Path) -> dict[int, dict]:
    return {int(p.stem[5:]): json.loads(p.read_text()) for p in run_dir.glob("step_*.json")}


def stopped_steps(log: str) -> set[int]:
    return {int(s) for s in re.findall(r"\[rank \d\] .*stopped at step (\d+)", log)}


def left_the_group(log: str) -> list[int]:
    """The ranks that destroyed their process group before exiting (every clean end of a job)."""
    return sorted(int(r) for r in re.findall(r"\[rank (\d)\] INFO left the process group", log))


def start_proxy(run_dir: Path) -> Daemon:
    return Daemon([sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run_dir)])


def stop_proxy(p: Daemon) -> int:
    if p.proc.poll() is None:
        p.signal(signal.SIGTERM)
    return p.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """Two ranks with the proxy in the loop, never stopped or killed; launched as two nodes (two
    torchrun agents meeting by c10d rendezvous on localhost, one worker each). Every other job
    here is one agent with two workers (--standalone): each comparison with this run also shows
    that the launch topology changes no bit."""
    run_dir = tmp_path_factory.mktemp("ddp-reference")
    launch = ["--nnodes", "2", "--rdzv-backend", "c10d"]
    launch += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "andrea-test"]
    proxy = start_proxy(run_dir)
    args = ("--mixing", "proxy", *ACCUM)
    nodes = [job(torchrun(run_dir, cache_dir, *args, nproc=1, launch=launch)) for _ in range(2)]
    for n in nodes:
        assert n.wait(timeout=300) == 0, n.log
    assert stop_proxy(proxy) == ExitCode.OK, proxy.log
    log = "".join(n.log for n in nodes)
    assert {m.group(1) for m in re.finditer(r"rank \d of 2 \(node (\d)", log)} == {"0", "1"}, log
    assert left_the_group(log) == [0, 1], log
    assert "in 2 micro-batch(es)" in log, log
    assert [s for s, _, _ in curve(run_dir)] == list(range(1, STEPS + 1))
    man = manifests(run_dir)[STEPS]
    assert man["environment"]["world_size"] == 2
    assert [r["rank"] for r in man["distributed"]["ranks"]] == [0, 1]
    # Each rank has its own random stream (dropout), and the cursors advance alike.
    r0, r1 = man["distributed"]["ranks"]
    assert r0["rng"]["torch_cpu"] != r1["rng"]["torch_cpu"]
    assert r0["data"] == r1["data"] == man["data"]
    return run_dir


def test_sigterm_to_the_agent_and_a_proxy_sigkill_then_resume_are_bit_exact(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    """SIGTERM to the agent: every rank checkpoints one step and exits 0. The resumed job's proxy
    is killed (-9) mid-run: the job holds, then goes on with a new proxy. The job ends on the
    reference's bytes, two micro-batches a step: neither the stop nor the kill changed a bit."""
    args = ("--mixing", "proxy", *ACCUM)
    proxy = start_proxy(tmp_path)
    t = job(torchrun(tmp_path, cache_dir, *args))
    t.wait_for(r"\[rank 0\] INFO step 4/")
    t.signal(signal.SIGTERM)
    # torchrun re-raises the signal it forwarded, so the agent itself exits 1 (docs/distributed.md);
    # what matters is that every worker checkpointed the same step and exited 0.
    assert t.wait(timeout=120) in (0, 1), t.log
    assert "exitcode  : " not in t.log, t.log
    (stopped,) = stopped_steps(t.log)
    saved = manifests(tmp_path)
    assert stopped < STEPS - 1, t.log
    assert max(saved) == stopped and final_trigger_is("sigterm", saved[stopped], t.log), t.log
    assert t.log.count(f"checkpoint {bin_name(stopped)} written") == 1

    # A resume on a machine that shows another number of GPUs: the saved CUDA generator states
    # (two devices, simulated) must not turn into a restart loop. On this CPU job they do not
    # apply, and the resume stays bit-exact.
    path = tmp_path / manifest_name(stopped)
    man = json.loads(path.read_text())
    fake = ["AAAAAAAAAAAAAAAAAAAAAA=="] * 2
    for r in [man["rng"]] + [x["rng"] for x in man["distributed"]["ranks"]]:
        r["torch_cuda"] = fake
    # Sealed again as the manifest's format says (sorted keys, compact, UTF-8), or it is damaged.
    body = {k: v for k, v in man.items() if k != "content_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    man["content_sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    path.write_text(json.dumps(man))

    t = job(torchrun(tmp_path, cache_dir, *args))
    t.wait_for(rf"\[rank 0\] INFO step {stopped + 1}/")
    proxy.signal(signal.SIGKILL)
    proxy.wait()
    t.wait_for(r"waiting for the proxy", timeout=60)
    assert t.proc.poll() is None, "the job must hold, not exit, while the proxy is down"
    proxy = start_proxy(tmp_path)
    assert t.wait(timeout=300) == 0, t.log
    assert stop_proxy(proxy) == ExitCode.OK, proxy.log
    assert f"resumed from {bin_name(stopped)}" in t.log
    assert "CUDA generator state" in t.log and "not restored" in t.log, t.log
    entries = read_entries(tmp_path / ".loss.json")
    assert sorted(e.step for e in entries) == list(range(1, STEPS + 1)), (
        "one entry per step (the mean over ranks), none lost, none twice"
    )
    assert curve(tmp_path) == curve(reference)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (reference / bin_name(STEPS)).read_bytes()
