"""The learnability reward in the loop: a real trainer and proxy, an arm of random bytes beside an arm
of prose. A new run keeps the random arm at its floor plus exploration; ODM's loss reward, asked for
by name, feeds it most of the steps (the failure the learnability reward exists for)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tomli_w

from andrea.daemon.mixing.policy import NEW_RUN_REWARD
from andrea.daemon.mixing.reward import exploration_rate
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import REPO, Daemon, trainer_cmd

STEPS = 240


def make_run(run_dir: Path) -> None:
    random = run_dir / "random"
    random.mkdir(parents=True)
    for i in range(40):
        stream = b"".join(hashlib.sha256(b"%d:%d" % (i, k)).digest() for k in range(128))
        (random / f"r{i:02d}.txt").write_bytes(stream)
    arms = [
        {"name": "prose", "kind": "text", "paths": [str(REPO / "docs" / "*.md")]},
        {"name": "random", "kind": "text", "paths": ["random/*.txt"]},
    ]
    (run_dir / "run.toml").write_text(tomli_w.dumps({"mixing": "proxy", "data": {"arms": arms}}))


def shares_of_second_half(run_dir: Path, *extra: str) -> float:
    make_run(run_dir)
    t = Daemon(
        trainer_cmd(
            run_dir,
            run_dir / "cache",
            "--with-proxy",
            "--max-steps",
            str(STEPS),
            "--checkpoint-every",
            "0",
            "--log-every",
            "60",
            *extra,
        )
    )
    assert t.wait(timeout=240) == ExitCode.OK, t.log
    arms = [e.arm for e in canonical_curve(read_entries(run_dir / ".loss.json"))]
    assert len(arms) == STEPS
    return arms[STEPS // 2 :].count("random") / (STEPS - STEPS // 2)


def test_a_random_arm_is_kept_at_its_floor(tmp_path: Path) -> None:
    share = shares_of_second_half(tmp_path / "new")
    # Exploration alone: eps_t is at most 0.054 over the second half (K = 2, t >= 112).
    assert share <= exploration_rate(2, STEPS // 2 - 8) + 0.05, share
    state = json.loads((tmp_path / "new" / ".state.json").read_text())
    report = state["live_reward"]
    assert report["kind"] == NEW_RUN_REWARD
    assert report["arms"]["random"]["reward"] < 0.05 < report["arms"]["prose"]["reward"]
    assert report["arms"]["random"]["loss"] > 5.0 > report["arms"]["prose"]["loss"]

    (tmp_path / "loss.toml").write_text('reward = "loss"\n')
    odm = shares_of_second_half(tmp_path / "odm", "--policy", str(tmp_path / "loss.toml"))
    assert odm > 0.5, odm
