"""Config changes are named or refused, and a deliberate one (--allow-config-change) is recorded in
run.toml so that every later plain restart runs under it — with the proxy too. One test per kind of
change the docs allow: optimizer, batch, seed, data (an arm removed: the zombie-arm workflow) and
mixing. Real trainer and proxy processes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from andrea.daemon.rundir.losslog import read_entries
from andrea.daemon.runtime.exitcodes import ExitCode

from ..support.daemons import run_trainer


def run_toml(run_dir: Path) -> dict:
    return tomllib.loads((run_dir / "run.toml").read_text())


def test_changes_are_named_refused_or_recorded(tmp_path: Path, cache_dir: Path) -> None:
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--max-steps", "10", "--checkpoint-every", "5")
    assert res.returncode == ExitCode.OK, res.stderr

    res = run_trainer(run, cache_dir, "--max-steps", "12", "--preset", "andrea-12m")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "--preset andrea-12m disagrees with this run's preset andrea-tiny" in res.stderr

    res = run_trainer(run, cache_dir, "--max-steps", "12", "--batch-size", "16")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "batch_size: 8 → 16" in res.stderr and "--allow-config-change" in res.stderr

    # Optimizer: an edit of run.toml is named by the checkpoint's own check.
    text = (run / "run.toml").read_text().replace("lr = 0.003\n", "lr = 0.002\n")
    (run / "run.toml").write_text(text)
    res = run_trainer(run, cache_dir, "--max-steps", "12")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "optim.lr: 0.003 → 0.002" in res.stderr, res.stderr

    # Batch (a flag) and optimizer at once, on purpose: recorded, then a plain restart runs.
    res = run_trainer(
        run, cache_dir, "--max-steps", "12", "--batch-size", "16", "--allow-config-change"
    )
    assert res.returncode == ExitCode.OK, res.stderr
    assert "recorded in run.toml: batch_size: 8 → 16" in res.stderr, res.stderr
    assert run_toml(run)["batch_size"] == 16 and run_toml(run)["optim"]["lr"] == 0.002
    res = run_trainer(run, cache_dir, "--max-steps", "14")
    assert res.returncode == ExitCode.OK and "resumed from step_000012.bin" in res.stderr, (
        res.stderr
    )
    assert [e.tokens for e in read_entries(run / ".loss.json")][-1] == 16 * 64


def test_deliberate_changes_with_the_proxy(tmp_path: Path, cache_dir: Path) -> None:
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--max-steps", "10", "--checkpoint-every", "5")
    assert res.returncode == ExitCode.OK, res.stderr

    # Mixing: fixed → proxy.
    res = run_trainer(run, cache_dir, "--max-steps", "12", "--with-proxy")
    assert res.returncode == ExitCode.RESUME_REFUSED and "mixing: fixed → proxy" in res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "12", "--with-proxy", "--allow-config-change")
    assert res.returncode == ExitCode.OK, res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "14", "--with-proxy")
    assert res.returncode == ExitCode.OK, res.stderr

    # Seed: the proxy started with the old run.toml takes the recorded one.
    res = run_trainer(
        run, cache_dir, "--max-steps", "16", "--with-proxy", "--seed", "7", "--allow-config-change"
    )
    assert res.returncode == ExitCode.OK, res.stderr
    assert run_toml(run)["seed"] == 7
    res = run_trainer(run, cache_dir, "--max-steps", "18", "--with-proxy")
    assert res.returncode == ExitCode.OK, res.stderr

    # Data: an arm removed (the zombie-arm workflow the refusal suggests).
    text = (run / "run.toml").read_text()
    start = text.index('[[data.arms]]\nname = "comments"')
    end = text.find("[[data.arms]]", start + 1)
    (run / "run.toml").write_text(text[:start] + (text[end:] if end != -1 else ""))
    res = run_trainer(run, cache_dir, "--max-steps", "20", "--with-proxy")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "data arm 'comments'" in res.stderr and "--allow-config-change" in res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "20", "--with-proxy", "--allow-config-change")
    assert res.returncode == ExitCode.OK, res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "22", "--with-proxy")
    assert res.returncode == ExitCode.OK, res.stderr
    state = json.loads((run / ".state.json").read_text())
    assert [z["name"] for z in state["zombies"]] == ["comments"]
    assert {e.arm for e in read_entries(run / ".loss.json") if e.step > 20} <= {
        "code",
        "docstrings",
    }
    assert [e.step for e in read_entries(run / ".loss.json")][-1] == 22
