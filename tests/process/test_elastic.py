"""Rented GPUs change between sessions: a run resumed at another world size, a new run started
from another run's checkpoint (--init-from), and the plan's exact figures against a real run.
Real torchrun jobs of gloo ranks on CPU, and real trainer processes.

One run carries the module: 2 ranks, then 1, then 2 again (each stop a final checkpoint at
max_steps), with two micro-batches a step. Its batches are checked against the data order itself:
`batch_sha256` of every step is recomputed from the arms, the fixed mixture and the cursors, as a
never-stopped run at any world size would draw them.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from andrea.control import andreactl
from andrea.daemon.config import build_config, load_toml
from andrea.daemon.data.arms import ArmStream, FixedMixture, load_arms
from andrea.daemon.data.batch_split import batch_shape
from andrea.daemon.rundir.layout import RESOLVED_CONFIG_FILE, bin_name, manifest_name
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import run_trainer
from tests.support.distributed import job, torchrun

LEG = 3  # steps per life of the cycle
ACCUM = ("--grad-accum", "2", "--eval-every", "0")


def ctl(capsys: pytest.CaptureFixture[str], run_dir: Path, *args: str) -> tuple[int, str]:
    """andreactl in this process (its reading commands import nothing heavy): code, stdout."""
    code = andreactl.main(["--run-dir", str(run_dir), *args])
    return code, capsys.readouterr().out


def manifest(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / manifest_name(step)).read_text())


def expected_digests(run_dir: Path, steps: int) -> list[str]:
    """The sha256 of each step's batch as the data order defines it: the fixed mixture's arm of
    the step, grad_accum micro-batches of the global micro-batch from that arm's cursor."""
    # As the trainer resolved and recorded it (a new run's shifted windows among what it settled).
    cfg = build_config(load_toml(run_dir / RESOLVED_CONFIG_FILE))
    arms = load_arms(cfg.data, run_dir, cfg.model.vocab_size)
    shifted = cfg.data.windows == "shifted"
    streams = [ArmStream(a, cfg.seed, cfg.model.block_size, shifted) for a in arms]
    mixture = FixedMixture([a.name for a in arms], [a.weight for a in cfg.data.arms], cfg.seed)
    micro = batch_shape(cfg, 1).micro_batch
    out = []
    for step in range(1, steps + 1):
        sha = hashlib.sha256()
        for _ in range(cfg.grad_accum):
            sha.update(streams[mixture.assign(step)].next_batch(micro).tobytes())
        out.append(sha.hexdigest())
    return out


@pytest.fixture(scope="module")
def cycled(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, list[str]]:
    """2 ranks → stop → 1 rank → stop → 2 ranks; returns the run and each life's log."""
    run_dir = tmp_path_factory.mktemp("elastic")
    logs = []
    for life, nproc in enumerate((2, 1, 2), start=1):
        args = ("--max-steps", str(LEG * life), "--checkpoint-every", "0", *ACCUM)
        if nproc == 1:
            res = run_trainer(run_dir, cache_dir, *args)
            assert res.returncode == 0, res.stderr
            logs.append(res.stderr)
        else:
            t = job(torchrun(run_dir, cache_dir, *args, nproc=nproc))
            assert t.wait(timeout=300) == 0, t.log
            logs.append(t.log)
    return run_dir, logs


def test_another_world_size_continues_the_data_stream_announced_as_inexact(
    cycled: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, logs = cycled
    # The start log says what a step is: 8 sequences of 64 tokens in 2 micro-batches of 4,
    # 2 per rank per micro-batch on 2 ranks.
    assert (
        "batch 8 sequences per step (512 tokens) in 2 micro-batch(es) of 4 (256 tokens); each of "
        "2 ranks: 4 sequences per step (256 tokens), 2 per micro-batch (128 tokens)" in logs[0]
    ), logs[0]
    assert "one rank: 8 sequences per step (512 tokens), 4 per micro-batch" in logs[1]
    entries = read_entries(run_dir / ".loss.json")
    assert sorted(e.step for e in entries) == list(range(1, 3 * LEG + 1)), "one entry per step"
    assert {e.tokens for e in entries} == {8 * 64}, "the tokens the start log announced"
    assert [e.segment for e in entries] == [1] * LEG + [2] * LEG + [3] * LEG
    curve = canonical_curve(entries)
    assert [e.batch_sha256 for e in curve] == expected_digests(run_dir, 3 * LEG), (
        "a batch skipped or repeated at a change of world size"
    )

    # A warning at each change, naming what changes; none at the first start.
    changes = [
        re.findall(r"WARNING resuming at world size (\d) from .* a job of (\d)", x) for x in logs
    ]
    assert changes == [[], [("1", "2")], [("2", "1")]], logs
    for log in logs[1:]:
        assert "will NOT be bit-exact" in log
        assert "each rank's dropout stream and the order of the gradient reduction" in log
        assert "the data stream continues exactly" in log
        assert "Adam's moments and the LR schedule continue" in log
    assert "rank 1 starts a stream of its own" in logs[2], logs[2]

    final = manifest(run_dir, 3 * LEG)
    assert final["lineage"]["world_sizes"] == [
        {"from_step": 0, "world_size": 2},
        {"from_step": LEG, "world_size": 1},
        {"from_step": 2 * LEG, "world_size": 2},
    ]
    assert final["optimizer"]["adam_step"] == 3 * LEG, "Adam's state continued"
    assert [r["data"] for r in final["distributed"]["ranks"]] == [final["data"]] * 2
    _, status = ctl(capsys, run_dir, "status")
    assert "lineage: world size 2 from the start, 1 after step 3, 2 after step 6" in status


def test_a_world_size_that_cannot_share_the_batch_is_refused(
    tmp_path: Path, cache_dir: Path
) -> None:
    # 6 sequences in 2 micro-batches of 3: two ranks cannot share one.
    t = job(torchrun(tmp_path, cache_dir, "--batch-size", "6", *ACCUM))
    assert t.wait(timeout=120) != 0
    assert (
        "batch_size 6 in 2 micro-batch(es) is 3 sequences each, which a job of 2 ranks cannot "
        "share equally: world sizes 1 or 3 would work with this batch, or batch_size 4 or 8 at "
        "world size 2 (grad_accum 2)" in t.log
    ), t.log
    assert not list(tmp_path.glob("step_*"))


def test_init_from_starts_a_new_run_from_another_runs_checkpoint(
    cycled: tuple[Path, list[str]],
    tmp_path: Path,
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source_dir, _ = cycled
    source = source_dir / bin_name(3 * LEG)
    src = manifest(source_dir, 3 * LEG)
    new = tmp_path / "new"
    args = ("--max-steps", "1", "--checkpoint-every", "0", "--eval-every", "0", "--seed", "7")
    t = job(torchrun(new, cache_dir, *args, "--init-from", str(source), "--init-from-optimizer"))
    assert t.wait(timeout=300) == 0, t.log
    assert f"new run started from {source} (step {3 * LEG}" in t.log, t.log
    man = manifest(new, 1)
    init = man["lineage"]["init_from"]
    assert init["path"] == str(source) and init["step"] == 3 * LEG and init["optimizer"]
    assert init["bin_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    raw = (source_dir / manifest_name(3 * LEG)).read_bytes()
    assert init["manifest_sha256"] == hashlib.sha256(raw).hexdigest()
    assert man["source_manifest"] == json.loads(raw)
    # Adam's step count went on from the source's; the weights are the source's after one
    # small update (a fresh model would be far from them).
    assert man["optimizer"]["adam_step"] == src["optimizer"]["adam_step"] + 1
    n = man["n_params"]
    got = np.fromfile(new / bin_name(1), dtype="<f4", offset=8, count=n)
    had = np.fromfile(source, dtype="<f4", offset=8, count=n)
    assert np.abs(got - had).max() < 5e-3, np.abs(got - had).max()
    assert man["config"]["seed"] == 7, "the new run keeps its own config"
    _, status = ctl(capsys, new, "status")
    assert f"started from {source} (sha256 {init['bin_sha256'][:12]}" in status
    code, _ = ctl(capsys, new, "export", "--to", str(tmp_path / "export"), "--json")
    assert code == 0
    exported = json.loads((tmp_path / "export" / "metrics.json").read_text())
    assert exported["lineage"]["init_from"] == init
    # Its own checkpoint resumes: Adam's count, carried on from the source, is no re-signed edit.
    res = run_trainer(new, cache_dir, "--max-steps", "2")
    assert res.returncode == 0, res.stderr
    assert "skipping checkpoint" not in res.stderr and f"resumed from {bin_name(1)}" in res.stderr
    assert manifest(new, 2)["optimizer"]["adam_step"] == src["optimizer"]["adam_step"] + 2

    # Never a way around the resume checks of a run that has checkpoints: each rank refuses on
    # its own, before the process group exists, and torchrun stops the others as soon as the
    # first exits (so how many ranks got to say it is a race); none trains.
    t = job(torchrun(source_dir, cache_dir, *args, "--init-from", str(new / bin_name(1))))
    assert t.wait(timeout=120) != 0
    refusal = f"--init-from starts a new run, and {source_dir} holds checkpoints"
    assert t.log.count(refusal) >= 1, t.log
    assert "resumed from" not in t.log and "starting at step" not in t.log, t.log
    assert max(int(p.stem[5:]) for p in source_dir.glob("step_*.json")) == 3 * LEG
    # A model of another shape is refused naming the difference.
    other = tmp_path / "other"
    res = run_trainer(other, cache_dir, "--preset", "andrea-12m", "--init-from", str(source))
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "its model is not this run's shape (block_size: 64 → 256;" in res.stderr


def test_plan_and_size_give_a_real_runs_bytes(
    cycled: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, _ = cycled
    step = 3 * LEG
    man = manifest(run_dir, step)
    n = man["n_params"]
    size = json.loads(ctl(capsys, run_dir, "size", "--json")[1])
    assert size == {
        "preset": "andrea-tiny",
        "n_params": n,
        "checkpoint_bytes": (run_dir / bin_name(step)).stat().st_size,
    }
    code, out = ctl(capsys, run_dir, "plan", "--gpus", "2", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["n_params"] == n
    assert plan["checkpoints"]["payload_bytes"] == man["bin_size"]
    # The payload's three arrays: weights, then Adam's m and v.
    assert plan["parameter_bytes"] == 4 * n
    assert plan["optimizer_bytes"] - 4 * len(man["layout"]) == man["bin_size"] - 8 - 4 * n
    assert plan["batch"]["tokens_per_step"] == read_entries(run_dir / ".loss.json")[-1].tokens
    # A CPU run's speed says nothing of a GPU's: the MFU stays an assumption.
    assert plan["speed"]["mfu_source"].startswith("assumed")
