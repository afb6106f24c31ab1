"""torchrun + DDP on CPU with gloo, 2 ranks: real `torchrun` agents, real worker processes, real
signals and sockets.

Every scenario is short (a few dozen steps of andrea-tiny, one thread per rank). The references
are runs that were never stopped, in fresh processes; comparisons are of bytes (the final .bin:
weights, m, v) and of the canonical loss curve.
"""

from __future__ import annotations

import hashlib
import json
import os
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
    nodes = [job(torchrun(run_dir, cache_dir, "--mixing", "proxy", nproc=1, launch=launch))]
    nodes.append(job(torchrun(run_dir, cache_dir, "--mixing", "proxy", nproc=1, launch=launch)))
    for n in nodes:
        assert n.wait(timeout=300) == 0, n.log
    assert stop_proxy(proxy) == ExitCode.OK, proxy.log
    log = "".join(n.log for n in nodes)
    assert {m.group(1) for m in re.finditer(r"rank \d of 2 \(node (\d)", log)} == {"0", "1"}, log
    assert left_the_group(log) == [0, 1], log
    assert [s for s, _, _ in curve(run_dir)] == list(range(1, STEPS + 1))
    man = manifests(run_dir)[STEPS]
    assert man["environment"]["world_size"] == 2
    assert [r["rank"] for r in man["distributed"]["ranks"]] == [0, 1]
    # Each rank has its own random stream (dropout), and the cursors advance alike.
    r0, r1 = man["distributed"]["ranks"]
    assert r0["rng"]["torch_cpu"] != r1["rng"]["torch_cpu"]
    assert r0["data"] == r1["data"] == man["data"]
    return run_dir


def test_sigterm_to_the_agent_then_resume_is_bit_exact(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    proxy = start_proxy(tmp_path)
    t = job(torchrun(tmp_path, cache_dir, "--mixing", "proxy"))
    t.wait_for(r"\[rank 0\] INFO step 5/")
    t.signal(signal.SIGTERM)
    # torchrun re-raises the signal it forwarded, so the agent itself exits 1 (docs/distributed.md);
    # what matters is that every worker checkpointed the same step and exited 0.
    assert t.wait(timeout=120) in (0, 1), t.log
    assert "exitcode  : " not in t.log, t.log
    (stopped,) = stopped_steps(t.log)
    saved = manifests(tmp_path)
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

    t = job(torchrun(tmp_path, cache_dir, "--mixing", "proxy"))
    assert t.wait(timeout=300) == 0, t.log
    assert stop_proxy(proxy) == ExitCode.OK, proxy.log
    assert f"resumed from {bin_name(stopped)}" in t.log
    assert "CUDA generator state" in t.log and "not restored" in t.log, t.log
    assert curve(tmp_path) == curve(reference)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (reference / bin_name(STEPS)).read_bytes()


def test_proxy_sigkill_is_invisible(tmp_path: Path, cache_dir: Path, reference: Path) -> None:
    proxy = start_proxy(tmp_path)
    t = job(torchrun(tmp_path, cache_dir, "--mixing", "proxy"))
    t.wait_for(r"\[rank 0\] INFO step 6/")
    proxy.signal(signal.SIGKILL)
    proxy.wait()
    t.wait_for(r"waiting for the proxy", timeout=60)
    assert t.proc.poll() is None, "the job must hold, not exit, while the proxy is down"
    proxy = start_proxy(tmp_path)
    assert t.wait(timeout=300) == 0, t.log
    assert stop_proxy(proxy) == ExitCode.OK, proxy.log
    entries = read_entries(tmp_path / ".loss.json")
    assert sorted(e.step for e in entries) == list(range(1, STEPS + 1)), (
        "one entry per step (the mean over ranks), none lost, none twice"
    )
    assert curve(tmp_path) == curve(reference)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (reference / bin_name(STEPS)).read_bytes()


def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(
    tmp_path: Path, cache_dir: Path
) -> None:
    t = job(torchrun(tmp_path, cache_dir, "--max-steps", "100000", "--checkpoint-every", "0"))
    pids = rank_pids(t)
    t.wait_for(r"\[rank 0\] INFO step 4/")
    os.kill(pids[1], signal.SIGTERM)
    # No signal reached the agent: its workers all exited 0, so it exits 0.
    assert t.wait(timeout=120) == 0, t.log
    (stopped,) = stopped_steps(t.log)
    assert len(re.findall(r"stopped at step", t.log)) == 2
    assert left_the_group(t.log) == [0, 1], t.log
    saved = manifests(tmp_path)
    assert list(saved) == [stopped] and saved[stopped]["trigger"] == "sigterm"


def test_sigusr1_to_rank_0_checkpoints_and_andreactl_stop_ends_the_job(
    tmp_path: Path, cache_dir: Path
) -> None:
    t = job(torchrun(tmp_path, cache_dir, "--max-steps", "100000", "--checkpoint-every", "0"))
    pids = rank_pids(t)
    t.wait_for(r"\[rank 0\] INFO step 3/")
    res = ctl(tmp_path, "--json", "status")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)["trainer"]
    assert status["pid"] == pids[0] and status["world_size"] == 2
    assert status["agent_pid"] == t.proc.pid

    os.kill(status["pid"], signal.SIGUSR1)
    m = t.wait_for(r"checkpoint (step_\d+)\.bin written \(sigusr1")
    usr1 = int(m.group(1)[5:])
    t.wait_for(rf"\[rank 0\] INFO step {usr1 + 2}/")
    assert t.proc.poll() is None, "SIGUSR1 checkpoints and continues"

    res = ctl(tmp_path, "stop", "--wait")
    assert res.returncode == 0, res.stdout + res.stderr
    assert t.wait(timeout=120) == 0, t.log
    (stopped,) = stopped_steps(t.log)
    saved = manifests(tmp_path)
    assert sorted(saved) == [usr1, stopped] and stopped > usr1
    assert saved[usr1]["trigger"] == "sigusr1" and saved[stopped]["trigger"] == "control"


def test_gradient_accumulation_under_ddp_resumes_bit_exact(tmp_path: Path, cache_dir: Path) -> None:
    """Two micro-batches a step, gradients synchronised on the last one only: a job stopped by
    SIGTERM to the agent and resumed ends on the same bytes as the same job never stopped."""
    accum = ("--grad-accum", "2")
    whole = tmp_path / "whole"
    t = job(torchrun(whole, cache_dir, *accum))
    assert t.wait(timeout=300) == 0, t.log

    stopped = tmp_path / "stopped"
    t = job(torchrun(stopped, cache_dir, *accum))
    t.wait_for(r"\[rank 0\] INFO step 5/")
    t.signal(signal.SIGTERM)
    assert t.wait(timeout=120) in (0, 1), t.log  # the agent re-raises what it forwarded
    (at,) = stopped_steps(t.log)
    assert at < STEPS and final_trigger_is("sigterm", manifests(stopped)[at], t.log), t.log
    t = job(torchrun(stopped, cache_dir, *accum))
    assert t.wait(timeout=300) == 0, t.log
    assert f"resumed from {bin_name(at)}" in t.log, t.log

    assert curve(stopped) == curve(whole)
    assert (stopped / bin_name(STEPS)).read_bytes() == (whole / bin_name(STEPS)).read_bytes()
