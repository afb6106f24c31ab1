"""Config changes are named or refused, and a deliberate one (--allow-config-change) is recorded in
the run's resolved config so that every later plain restart runs under it — with the proxy too.
Every kind of change the docs allow, in one run, each named when refused: optimizer and batch, then
mixing, then seed, then data (an arm removed: the zombie-arm workflow) under the proxy; and a person's
run.toml, never rewritten. Real trainer and proxy processes."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w

from andrea.daemon.checkpoint.manager import checkpoint_steps, read_manifest
from andrea.daemon.rundir.layout import RESOLVED_CONFIG_FILE, recorded_config
from andrea.daemon.rundir.losslog import read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import run_trainer


def run_toml(run_dir: Path) -> dict:
    """The config the run trains under, as the trainer recorded it."""
    path = recorded_config(run_dir)
    assert path is not None and path.name == RESOLVED_CONFIG_FILE
    return tomllib.loads(path.read_text())


def test_changes_are_named_refused_or_recorded(tmp_path: Path, cache_dir: Path) -> None:
    """One run through every kind of change, each named, then made on purpose and recorded."""
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--max-steps", "10", "--checkpoint-every", "5")
    assert res.returncode == ExitCode.OK, res.stderr
    _optimizer_and_batch(run, cache_dir)
    _mixing(run, cache_dir)
    _seed_and_data(run, cache_dir)


def _optimizer_and_batch(run: Path, cache_dir: Path) -> None:
    res = run_trainer(run, cache_dir, "--max-steps", "12", "--preset", "andrea-12m")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "--preset andrea-12m disagrees with this run's preset andrea-tiny" in res.stderr

    res = run_trainer(run, cache_dir, "--max-steps", "12", "--batch-size", "16")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "batch_size: 8 → 16" in res.stderr and "--allow-config-change" in res.stderr

    # Optimizer: an edit of run.toml is named against the run's recorded config.
    text = (run / "run.toml").read_text().replace("lr = 0.003\n", "lr = 0.002\n")
    (run / "run.toml").write_text(text)
    res = run_trainer(run, cache_dir, "--max-steps", "12")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "optim.lr: 0.003 → 0.002" in res.stderr, res.stderr

    # Batch (a flag) and optimizer at once, on purpose: recorded.
    res = run_trainer(
        run, cache_dir, "--max-steps", "12", "--batch-size", "16", "--allow-config-change"
    )
    assert res.returncode == ExitCode.OK, res.stderr
    assert "recorded in .run.resolved.toml: batch_size: 8 → 16" in res.stderr, res.stderr
    assert run_toml(run)["batch_size"] == 16 and run_toml(run)["optim"]["lr"] == 0.002


def _mixing(run: Path, cache_dir: Path) -> None:
    """Fixed → proxy, named alone (the batch and optimizer are the run's now); then a plain
    restart runs under all three: batch, optimizer and mixing."""
    res = run_trainer(run, cache_dir, "--max-steps", "14", "--with-proxy")
    assert res.returncode == ExitCode.RESUME_REFUSED and "mixing: fixed → proxy" in res.stderr
    assert "batch_size" not in res.stderr and "optim.lr" not in res.stderr, res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "14", "--with-proxy", "--allow-config-change")
    assert res.returncode == ExitCode.OK, res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "16", "--with-proxy")
    assert res.returncode == ExitCode.OK and "resumed from step_000014.bin" in res.stderr, (
        res.stderr
    )
    assert [e.tokens for e in read_entries(run / ".loss.json")][-1] == 16 * 64


def _seed_and_data(run: Path, cache_dir: Path) -> None:
    """Seed and data in one deliberate start (an arm removed: the zombie-arm workflow the refusal
    suggests), under the proxy. The proxy sets the old seed's state aside and rebuilds its bandit
    from a log that trained on the removed arm: that arm becomes a zombie (it used to stop the
    run, "unknown arm"), and a plain restart continues under both changes."""
    # (Edited as TOML: how the trainer lays out the arms it wrote, inline or as [[data.arms]]
    # tables, is tomli-w's choice.)
    values = tomllib.loads((run / "run.toml").read_text())
    values["data"]["arms"] = [a for a in values["data"]["arms"] if a["name"] != "comments"]
    (run / "run.toml").write_text(tomli_w.dumps(values))
    res = run_trainer(run, cache_dir, "--max-steps", "20", "--with-proxy")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "data arm 'comments'" in res.stderr and "--allow-config-change" in res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "20", "--with-proxy", "--seed", "7")
    assert res.returncode == ExitCode.RESUME_REFUSED and "seed: 1337 → 7" in res.stderr, res.stderr
    res = run_trainer(
        run, cache_dir, "--max-steps", "20", "--with-proxy", "--seed", "7", "--allow-config-change"
    )
    assert res.returncode == ExitCode.OK, res.stderr
    assert run_toml(run)["seed"] == 7
    res = run_trainer(run, cache_dir, "--max-steps", "22", "--with-proxy")
    assert res.returncode == ExitCode.OK, res.stderr
    state = json.loads((run / ".state.json").read_text())
    assert [z["name"] for z in state["zombies"]] == ["comments"]
    assert {e.arm for e in read_entries(run / ".loss.json") if e.step > 20} <= {
        "code",
        "docstrings",
    }
    assert [e.step for e in read_entries(run / ".loss.json")][-1] == 22


#: A person's run.toml, as people write them: comments, their own layout, a preset.
HAND_WRITTEN = """# my run: written by hand, commented
preset = "andrea-12m"   # the bigger model

[[data.arms]]
name = "web"
kind = "jsonl"
paths = ["web.jsonl"]
"""


def _start(run: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    """A trainer start without run_trainer's --preset: the run's own file says it."""
    args = ["--run-dir", str(run), "--threads", "1", "--cache-dir", str(cache), "--sample-every"]
    cmd = [sys.executable, "-m", "andrea.daemon.trainer.service.cli", *args, "0", *extra]
    return forkserver.run(cmd, capture_output=True, text=True, timeout=180)


def test_a_hand_written_run_toml_is_never_rewritten(tmp_path: Path, cache_dir: Path) -> None:
    """Issue 50: the first start replaced a person's run.toml with the resolved config (comments
    gone); after a failed first start it held that preset's shape, and a later preset change then
    trained the old shape and schedule, with no warning."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.toml").write_text(HAND_WRITTEN)
    (run / "web.jsonl").write_text("")
    res = _start(run, cache_dir, "--max-steps", "4", "--checkpoint-every", "2")
    assert res.returncode == ExitCode.DATA_ERROR, res.stderr
    assert (run / "run.toml").read_text() == HAND_WRITTEN

    # A preset change before any checkpoint means the preset: its shape and its schedule.
    changed = HAND_WRITTEN.replace('preset = "andrea-12m"', 'preset = "andrea-tiny"')
    (run / "run.toml").write_text(changed)
    rows = "".join(
        json.dumps({"text": f"document {i}: " + "some prose " * 40}) + "\n" for i in range(60)
    )
    (run / "web.jsonl").write_text(rows)
    res = _start(run, cache_dir, "--max-steps", "4", "--checkpoint-every", "2")
    assert res.returncode == ExitCode.OK, res.stderr
    assert "model andrea-tiny: " in res.stderr, res.stderr
    model = read_manifest(run, 4).config["model"]
    assert (model["n_layer"], model["n_embd"], model["block_size"]) == (2, 64, 64)
    assert read_manifest(run, 4).config["optim"]["warmup_steps"] == 20
    assert (run / "run.toml").read_text() == changed

    # A preset change once the run has checkpoints: refused (a run keeps its model).
    (run / "run.toml").write_text(HAND_WRITTEN)
    res = _start(run, cache_dir, "--max-steps", "6")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "sets preset andrea-12m, and this run (it has checkpoints) is andrea-tiny" in res.stderr
    assert (run / "run.toml").read_text() == HAND_WRITTEN and checkpoint_steps(run)[0] == 4
    # (An accepted change beside an unchanged file: test_changes_are_named_refused_or_recorded.)
