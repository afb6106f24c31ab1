"""The polish pivot: one command, and the manual path (stop, new policy, start) giving the same run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from andrea.daemon.exitcodes import ExitCode
from andrea.daemon.losslog import canonical_curve, read_entries
from andrea.daemon.rundir import bin_name

from .conftest import Trainer, trainer_cmd

STEPS = 75
EVERY = 25
# Caps of 0 leave docstrings as the only arm: every step after the pivot must come from it.
POLICY = "[arms.code]\ncap = 0.0\n[arms.comments]\ncap = 0.0\n"


def proxy(run_dir: Path) -> Trainer:
    return Trainer([sys.executable, "-m", "andrea.daemon.proxy_cli", "--run-dir", str(run_dir)])


def trainer(run_dir: Path, cache: Path, steps: int) -> Trainer:
    return Trainer(
        trainer_cmd(
            run_dir,
            cache,
            "--mixing",
            "proxy",
            "--max-steps",
            str(steps),
            "--checkpoint-every",
            str(EVERY),
            "--sample-every",
            "10",
        )
    )


def curve(run_dir: Path) -> list[tuple[int, float, str, int]]:
    return [
        (e.step, e.loss, e.arm, e.phase)
        for e in canonical_curve(read_entries(run_dir / ".loss.json"))
    ]


def stop(p: Trainer) -> int:
    p.signal(signal.SIGTERM)
    return p.wait()


def test_pivot_command_and_manual_path_agree(tmp_path: Path, cache_dir: Path) -> None:
    policy = tmp_path / "polish.toml"
    policy.write_text(POLICY)

    # One command.
    a = tmp_path / "a"
    p, t = proxy(a), trainer(a, cache_dir, STEPS)
    t.wait_for(r"step 3/")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "andrea.control.andreactl",
            "--run-dir",
            str(a),
            "--json",
            "pivot",
            "--policy",
            str(policy),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr + t.log
    result = json.loads(res.stdout)
    assert result["boundary_step"] == EVERY and result["phase"] == 1
    assert t.wait() == ExitCode.OK, t.log
    assert stop(p) == ExitCode.OK, p.log

    man = json.loads((a / f"step_{EVERY:06d}.json").read_text())
    assert man["trigger"] == "boundary"
    archive = a / result["archive"]
    assert {f.name for f in archive.iterdir()} == {
        ".state.json",
        ".samples.json",
        "policy.toml",
        "pivot.json",
    }
    assert json.loads((archive / ".state.json").read_text())["bandit"]["phase"] == 0
    c = curve(a)
    assert [s for s, *_ in c] == list(range(1, STEPS + 1)), (
        "the loss history continues across the pivot"
    )
    assert {arm for s, _, arm, ph in c if s > EVERY} == {"docstrings"}
    assert all(ph == (0 if s <= EVERY else 1) for s, _, _, ph in c)
    assert len({arm for s, _, arm, _ in c if s <= EVERY}) == 3

    # The manual path: stop the trainer at the boundary, stop the proxy, new policy, start both.
    b = tmp_path / "b"
    p, t = proxy(b), trainer(b, cache_dir, EVERY)
    assert t.wait() == ExitCode.OK, t.log
    assert stop(p) == ExitCode.OK, p.log
    (b / "policy.toml").write_text(POLICY)
    p = proxy(b)
    p.wait_for(r"pivot: phase 1 starts after step 25")
    t = trainer(b, cache_dir, STEPS)
    assert t.wait() == ExitCode.OK, t.log
    assert stop(p) == ExitCode.OK, p.log

    assert curve(b) == c
    assert (b / bin_name(STEPS)).read_bytes() == (a / bin_name(STEPS)).read_bytes()


def test_bad_pivot_policy_changes_nothing(tmp_path: Path, cache_dir: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[arms.code]\nfloor = 0.7\n[arms.comments]\nfloor = 0.7\n")
    p, t = proxy(tmp_path / "r"), trainer(tmp_path / "r", cache_dir, 100000)
    t.wait_for(r"step 3/")
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "andrea.control.andreactl",
            "--run-dir",
            str(tmp_path / "r"),
            "pivot",
            "--policy",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "floor" in res.stderr
    assert "holding" not in t.log
    assert stop(t) == ExitCode.OK and stop(p) == ExitCode.OK
    assert not (tmp_path / "r" / "archive").exists()


def test_damaged_state_after_a_pivot_is_rebuilt_in_the_right_phase(
    tmp_path: Path, cache_dir: Path
) -> None:
    """The recovery replays .loss.json from the newest pivot's boundary, under the current policy."""
    (tmp_path / "policy.toml").write_text(POLICY)
    p, t = proxy(tmp_path), trainer(tmp_path, cache_dir, EVERY)
    assert t.wait() == ExitCode.OK and stop(p) == ExitCode.OK
    (tmp_path / "policy.toml").write_text(POLICY.replace("cap = 0.0", "cap = 0.5", 1))
    p = proxy(tmp_path)
    p.wait_for(r"pivot: phase 1 starts after step 25")
    t = trainer(tmp_path, cache_dir, EVERY + 10)
    assert t.wait() == ExitCode.OK, t.log
    assert stop(p) == ExitCode.OK
    before = json.loads((tmp_path / ".state.json").read_text())["live_probabilities"]
    (tmp_path / ".state.json").write_text("{")
    p = proxy(tmp_path)
    p.wait_for(r"bandit for phase 1 \(after step 25\)")
    p.wait_for(r"proxy ready")
    assert stop(p) == ExitCode.OK
    state = json.loads((tmp_path / ".state.json").read_text())
    assert state["bandit"]["phase"] == 1 and state["bandit"]["phase_start_step"] == EVERY
    assert before.keys() == state["live_probabilities"].keys()
