"""FSDP2 (`[distributed] strategy = "fsdp"`) on CPU with gloo: real torchrun jobs, real signals.

Every job trains andrea-tiny with two micro-batches a step (the gradient sync skipped on the
first), dropout on, held-out evaluation every 2 steps and samples every 3 (both forward passes of
every rank together). The references are jobs never stopped; the comparisons are of bytes: the
final `.bin` (weights, m, v) and the canonical loss curve.

- 2 ranks: stopped by SIGTERM to one rank (every rank stops at the same step, and the agent,
  which no signal reached, exits 0), resumed, killed by SIGKILL after a cadence checkpoint,
  resumed: the same bytes as the reference.
- 3 ranks, GPT-2's padded vocabulary of 50,304 (an embedding and a head of 3.2M weights each,
  16,768 rows a rank; the position embedding's 64 rows and every n_embd-long vector shard
  unevenly, 22/21/21): stopped by SIGTERM and resumed, with activation recompute on, the same
  bytes as the run without it, never stopped (torchtitan #1136).
- A change of strategy and of world size: FSDP 2 → DDP 2 → FSDP 3 → one process, each change
  announced as not bit-exact, every step's batch the data order's own (none skipped or repeated);
  the FSDP 3 leg, seen by `andreactl status` (rank 0's pid, the agent's, the world size),
  checkpoints on SIGUSR1 to rank 0 and continues, then stops through `andreactl stop --wait`.
  These signal and control paths are the same under DDP (tests/process/test_distributed.py
  tests SIGTERM to its agent).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from andrea.control import andreactl
from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.rundir.losslog import read_entries
from tests.process.test_distributed import (
    ctl,
    curve,
    left_the_group,
    manifests,
    rank_pids,
    stopped_steps,
)
from tests.process.test_elastic import expected_digests
from tests.support.daemons import Daemon, run_trainer
from tests.support.distributed import job, torchrun
from tests.support.manifests import final_trigger_is

STEPS = 8
EVERY = 4
#: Global batch 12 in 2 micro-batches: 3 sequences per rank at 2 ranks, 2 at 3.
RUN_TOML = """preset = "andrea-tiny"
batch_size_per = "step"
batch_size = 12
grad_accum = 2

[data]
heldout_fraction = 0.05

[eval]
sequences = 4

[samples]
max_new_tokens = 4
"""
ARGS = ("--checkpoint-every", str(EVERY), "--eval-every", "2", "--sample-every", "3")


def fsdp_job(
    run_dir: Path,
    cache: Path,
    nproc: int,
    *extra: str,
    vocab: int | None = None,
    steps: int = STEPS,
) -> Daemon:
    """A job of `nproc` FSDP ranks to step `steps` (run.toml written on its first start)."""
    if not (run_dir / "run.toml").exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        model = f"\n[model]\nvocab_size = {vocab}\n" if vocab else ""
        (run_dir / "run.toml").write_text(RUN_TOML + model)
    args = ("--max-steps", str(steps), *ARGS, "--strategy", "fsdp", *extra)
    return job(torchrun(run_dir, cache, *args, nproc=nproc))


def finished(t: Daemon) -> str:
    assert t.wait(timeout=300) == 0, t.log
    return t.log


def sigterm_at(t: Daemon, step: int) -> int:
    """SIGTERM to torchrun at `step`: the step every rank stopped at, with its final checkpoint."""
    t.wait_for(rf"\[rank 0\] INFO step {step}/")
    t.signal(signal.SIGTERM)
    assert t.wait(timeout=120) in (0, 1), t.log  # the agent re-raises what it forwarded
    (at,) = stopped_steps(t.log)
    return at


def same_bytes(a: Path, b: Path, steps: int = STEPS) -> None:
    assert curve(a) == curve(b)
    assert (a / bin_name(steps)).read_bytes() == (b / bin_name(steps)).read_bytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """Two FSDP ranks, never stopped."""
    run_dir = tmp_path_factory.mktemp("fsdp-reference")
    log = finished(fsdp_job(run_dir, cache_dir, 2))
    assert "held-out loss at step 2" in log and "sample at step 3" in log, log
    assert manifests(run_dir)[STEPS]["environment"]["sharding"] == "fsdp"
    return run_dir


def test_sigterm_and_sigkill_then_resume_are_bit_exact_at_2_ranks(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    run = tmp_path / "run"
    t = fsdp_job(run, cache_dir, 2)
    pids = rank_pids(t)
    t.wait_for(r"\[rank 0\] INFO step 2/")
    os.kill(pids[1], signal.SIGTERM)
    # No signal reached the agent: its workers all exited 0, so it exits 0.
    assert t.wait(timeout=120) == 0, t.log
    (at,) = stopped_steps(t.log)
    assert len(re.findall(r"stopped at step", t.log)) == 2 and left_the_group(t.log) == [0, 1]
    assert at < EVERY and final_trigger_is("sigterm", manifests(run)[at], t.log), t.log
    # Resumed (with no end in sight: max_steps changes no step), then SIGKILLed, every process
    # of the job, once the cadence checkpoint is durable.
    t = fsdp_job(run, cache_dir, 2, "--max-steps", "1000")
    pids = rank_pids(t)  # torchrun's workers are not in its process group
    t.wait_for(rf"checkpoint {bin_name(EVERY)} written")
    for pid in [*pids.values(), t.proc.pid]:
        os.kill(pid, signal.SIGKILL)
    t.wait(timeout=60)
    for pid in pids.values():
        while Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
    log = finished(fsdp_job(run, cache_dir, 2))
    assert f"resumed from {bin_name(EVERY)}" in log and "NOT be bit-exact" not in log, log
    same_bytes(run, reference)


def test_the_bin_is_the_seed_format_with_ddp_layout(reference: Path) -> None:
    """int32 step, int32 n, then fp32 weights, m and v, read by numpy alone; n and the layout
    are the model's, as a DDP run writes them (the chain below resumes it under DDP)."""
    raw = (reference / bin_name(STEPS)).read_bytes()
    step, n = np.frombuffer(raw[:8], dtype=np.int32)
    man = manifests(reference)[STEPS]
    assert step == STEPS and n == sum(int(np.prod(e["shape"])) for e in man["layout"])
    assert len(raw) == checkpoint_format.payload_size(int(n))
    w, m, v = np.frombuffer(raw[8:], dtype=np.float32).reshape(3, n)
    assert np.isfinite(w).all() and (v >= 0).all() and np.abs(m).sum() > 0


#: GPT-2's vocabulary padded to a multiple of 64, the size nanoGPT and llm.c train with.
GPT2_VOCAB = 50_304
#: Its steps cost far more than andrea-tiny's (gathers of 3.2M-weight shards, 50,304 logits a
#: token): fewer of them, still past evaluations (2, 4) and a sample (3), the stop among them.
GPT2_STEPS = 5


def test_a_gpt2_vocabulary_with_uneven_shards_resumes_bit_exact_at_3_ranks(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> None:
    whole = tmp_path_factory.mktemp("fsdp3-whole")
    gpt2 = {"vocab": GPT2_VOCAB, "steps": GPT2_STEPS}
    log = finished(fsdp_job(whole, cache_dir, 3, **gpt2))
    assert "held-out loss at step 4" in log and "sample at step 3" in log, log
    shapes = [e["shape"] for e in manifests(whole)[GPT2_STEPS]["layout"]]
    assert [GPT2_VOCAB, 64] in shapes, shapes
    assert any(shape[0] % 3 for shape in shapes), shapes  # some shards are uneven
    # The stopped run recomputes each block's activations in the backward pass (inside each
    # fully_shard unit), from its first step and after its resume: the same bits as the whole
    # run, which keeps them (dropout on: the recompute must draw the forward's masks again).
    stopped = tmp_path_factory.mktemp("fsdp3-stopped")
    recompute = ("--recompute", "blocks")
    at = sigterm_at(fsdp_job(stopped, cache_dir, 3, *recompute, **gpt2), 2)
    assert at < GPT2_STEPS
    log = finished(fsdp_job(stopped, cache_dir, 3, *recompute, **gpt2))
    assert f"resumed from {bin_name(at)}" in log and "NOT be bit-exact" not in log, log
    assert "activation recompute per block" in log, log
    same_bytes(stopped, whole, GPT2_STEPS)


def test_fsdp_ddp_fsdp_single_continues_announced(
    tmp_path: Path, cache_dir: Path, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the reference's checkpoint of step EVERY: DDP 2 → FSDP 3 → one process; each change
    announced, the data stream continuous. The FSDP leg checkpoints on SIGUSR1 to rank 0 and
    continues, then stops through `andreactl stop --wait`, as a DDP job does."""
    run = tmp_path / "chain"
    shutil.copytree(reference, run, ignore=shutil.ignore_patterns(".sock", ".socket-dir", "*.lock"))
    for p in run.glob(f"step_{STEPS:06d}.*"):
        p.unlink()
    ddp2 = ("--max-steps", str(EVERY + 2), *ARGS, "--strategy", "ddp")
    logs = [finished(job(torchrun(run, cache_dir, *ddp2, nproc=2)))]

    fsdp3 = ("--max-steps", "1000", *ARGS, "--strategy", "fsdp")
    t = job(torchrun(run, cache_dir, *fsdp3, nproc=3))
    pids = rank_pids(t, 3)
    t.wait_for(rf"\[rank 0\] INFO step {EVERY + 3}/")
    # In this process (a reading command imports nothing heavy): the job trains on meanwhile.
    assert andreactl.main(["--run-dir", str(run), "--json", "status"]) == 0
    status = json.loads(capsys.readouterr().out)["trainer"]
    assert status["pid"] == pids[0] and status["world_size"] == 3
    assert status["agent_pid"] == t.proc.pid
    os.kill(status["pid"], signal.SIGUSR1)
    # Written, or the cadence checkpoint of that very step kept as requested.
    m = t.wait_for(
        r"checkpoint (?:step_(\d+)\.bin written|of step (\d+) already written; kept as requested)"
        r" \(sigusr1"
    )
    usr1 = int(m.group(1) or m.group(2))
    t.wait_for(rf"\[rank 0\] INFO step {usr1 + 1}/")
    res = ctl(run, "stop", "--wait")
    assert res.returncode == 0, res.stdout + res.stderr
    logs.append(finished(t))
    (stopped,) = stopped_steps(logs[1])
    saved = manifests(run)
    assert saved[usr1]["trigger"] in ("sigusr1", "cadence") and usr1 > EVERY + 2
    assert final_trigger_is("control", saved[stopped], logs[1]), logs[1]
    assert stopped > usr1 and saved[stopped]["environment"]["sharding"] == "fsdp"

    last = stopped + 2
    res = run_trainer(run, cache_dir, "--max-steps", str(last), *ARGS, "--strategy", "ddp")
    assert res.returncode == 0, res.stderr
    logs.append(res.stderr)
    assert "sharding: fsdp → replicated" in logs[0], logs[0]
    assert "sharding: replicated → fsdp" in logs[1] and "world size 3" in logs[1], logs[1]
    assert "sharding: fsdp → replicated" in logs[2] and "world size 1" in logs[2], logs[2]
    entries = {e.step: e for e in read_entries(run / ".loss.json")}
    assert sorted(entries) == list(range(1, last + 1))
    digests = [entries[s].batch_sha256 for s in range(1, last + 1)]
    assert digests == expected_digests(run, last)
    world = [w["world_size"] for w in manifests(run)[last]["lineage"]["world_sizes"]]
    assert world == [2, 3, 1], world
    assert re.search(r"resumed from step_0+4\.bin", logs[0]), logs[0]
