"""The proxy in the loop: real trainer and proxy processes, real sockets, real SIGKILLs.

The reference for every crash test is a run in which neither process was ever killed; the claims
are that a crash of either is invisible in the result (final .bin bytes, canonical loss curve and
arm sequence) and that .loss.json ends with exactly one canonical entry per step.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from andrea.daemon.mixing.policy import NEW_RUN_REWARD
from andrea.daemon.rundir.layout import bin_name, peer_endpoint
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.protocol import messages
from andrea.protocol.transport import new_id, request
from tests.support import forkserver
from tests.support.daemons import Daemon, trainer_cmd

STEPS = 60
#: Seconds to wait for a daemon's log line or exit: generous, for a loaded 2-core machine.
WAIT = 300


def proxy_cmd(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run_dir), *extra]


def start_proxy(run_dir: Path, *extra: str) -> Daemon:
    return Daemon(proxy_cmd(run_dir, *extra))


def proxy_trainer(run_dir: Path, cache: Path, *extra: str) -> Daemon:
    return Daemon(
        trainer_cmd(
            run_dir,
            cache,
            "--mixing",
            "proxy",
            "--max-steps",
            str(STEPS),
            "--checkpoint-every",
            "10",
            *extra,
        )
    )


def curve(run_dir: Path) -> list[tuple[int, float, str]]:
    return [(e.step, e.loss, e.arm) for e in canonical_curve(read_entries(run_dir / ".loss.json"))]


def carried(run_dir: Path) -> dict[int, dict[str, float]]:
    """The evaluations the records carry, as the bandit reads them (the first record of a step)."""
    out: dict[int, dict[str, float]] = {}
    for e in read_entries(run_dir / ".loss.json"):
        if e.heldout is not None:
            out.setdefault(e.step, e.heldout)
    return out


def stop(p: Daemon) -> int:
    if p.proc.poll() is None:
        p.signal(signal.SIGTERM)
    return p.wait(WAIT)


def never_killed(run_dir: Path, cache: Path, *proxy_args: str) -> Path:
    proxy = start_proxy(run_dir, *proxy_args)
    t = proxy_trainer(run_dir, cache)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert stop(proxy) == ExitCode.OK, proxy.log
    assert [s for s, _, _ in curve(run_dir)] == list(range(1, STEPS + 1))
    return run_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """Trainer and proxy, never killed: a new run, so the learnability reward."""
    return never_killed(tmp_path_factory.mktemp("reference"), cache_dir)


@pytest.fixture(scope="module")
def loss_reference(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The same under ODM's loss reward, which runs created before the choice keep."""
    root = tmp_path_factory.mktemp("loss-reference")
    (root / "loss.toml").write_text('reward = "loss"\n')
    return never_killed(root / "run", cache_dir, "--policy", str(root / "loss.toml"))


def test_reference_mixes_arms_and_writes_the_satellite_files(reference: Path) -> None:
    arms = {a for _, _, a in curve(reference)}
    assert arms == {"docstrings", "code", "comments"}
    state = json.loads((reference / ".state.json").read_text())
    assert state["durable_step"] == STEPS
    assert abs(sum(state["live_probabilities"].values()) - 1) < 1e-12
    # The persisted bandit lags the log by at least W - 1 steps, by design (see assignbook).
    assert state["bandit"]["last_step"] <= STEPS + 1 - state["bandit"]["policy"]["lag"]
    # A new run names its reward in its policy file, and reports each arm's standing.
    assert f'reward = "{NEW_RUN_REWARD}"' in (reference / "policy.toml").read_text()
    assert state["bandit"]["version"] == 2 and state["live_reward"]["kind"] == NEW_RUN_REWARD
    for arm, report in state["live_reward"]["arms"].items():
        assert report["pulls"] > 0 and report["loss"] > 0, arm
    assert sum(r["reward"] for r in state["live_reward"]["arms"].values()) == pytest.approx(1.0)
    # Evaluations every checkpoint (10 steps): the record after each carries it to the bandit.
    assert sorted(carried(reference)) == list(range(11, STEPS + 1, 10))


def kill_the_proxy_at(run_dir: Path, t: Daemon, proxy: Daemon, step: int) -> None:
    """SIGKILL the proxy at `step`: the trainer holds for it, waiting, instead of exiting."""
    t.wait_for(rf"step {step}/", timeout=WAIT)
    proxy.signal(signal.SIGKILL)
    proxy.wait()
    t.wait_for(r"waiting for the proxy", timeout=WAIT)
    assert t.proc.poll() is None, "the trainer must hold, not exit, while the proxy is down"


def stop_torchless(proxy: Daemon) -> None:
    """Stop a proxy started on a run with checkpoints: it read their manifests, yet it never
    loaded torch (3-4 s of CPU)."""
    assert "libtorch" not in Path(f"/proc/{proxy.proc.pid}/maps").read_text()
    assert stop(proxy) == ExitCode.OK, proxy.log


def assert_as_never_killed(run_dir: Path, reference: Path) -> None:
    assert curve(run_dir) == curve(reference)
    assert carried(run_dir) == carried(reference)
    assert (run_dir / bin_name(STEPS)).read_bytes() == (reference / bin_name(STEPS)).read_bytes()


def test_proxy_sigkills_are_invisible_and_a_damaged_state_is_rebuilt(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    """The proxy killed twice under the new run's reward: once with its state intact, once with
    .state.json damaged after the kill (rebuilt from .loss.json, the damaged file kept)."""
    proxy = start_proxy(tmp_path)
    t = proxy_trainer(tmp_path, cache_dir)
    kill_the_proxy_at(tmp_path, t, proxy, 25)
    proxy = start_proxy(tmp_path)
    kill_the_proxy_at(tmp_path, t, proxy, 40)
    (tmp_path / ".state.json").write_text('{"format": "andrea-proxy-state/1", "durable_st')
    proxy = start_proxy(tmp_path)
    proxy.wait_for(r"rebuilding the bandit from .loss.json", timeout=WAIT)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    stop_torchless(proxy)
    assert list(tmp_path.glob(".state.json.corrupt-*")), "the damaged file is kept for inspection"
    entries = read_entries(tmp_path / ".loss.json")
    assert len({e.segment for e in entries}) == 1, "the trainer never restarted"
    assert sorted(e.step for e in entries) == list(range(1, STEPS + 1)), (
        "one entry per step, none lost, none twice"
    )
    assert_as_never_killed(tmp_path, reference)


def test_proxy_and_trainer_sigkills_under_the_loss_reward(
    tmp_path: Path, cache_dir: Path, loss_reference: Path
) -> None:
    """Under ODM's loss reward: the proxy killed (the trainer holds, never restarted), then the
    trainer killed after its checkpoint of step 30 (a new segment starts at the checkpoint)."""
    shutil.copy(loss_reference / "policy.toml", tmp_path / "policy.toml")
    proxy = start_proxy(tmp_path)
    t = proxy_trainer(tmp_path, cache_dir)
    kill_the_proxy_at(tmp_path, t, proxy, 25)
    proxy = start_proxy(tmp_path)
    t.wait_for(r"step 35/", timeout=WAIT)
    t.signal(signal.SIGKILL)
    t.wait()
    t = proxy_trainer(tmp_path, cache_dir)
    # Cadence checkpoints are written in the background: the kill may land before step 30's commits.
    resumed = int(t.wait_for(r"resumed from step_(\d+)\.bin", timeout=WAIT).group(1))
    assert resumed in (20, 30)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    stop_torchless(proxy)
    entries = read_entries(tmp_path / ".loss.json")
    first = {e.step: e for e in entries if e.segment == 1}
    second = {e.step: e for e in entries if e.segment == 2}
    assert {e.segment for e in entries} == {1, 2}, "the proxy's restart restarted no trainer"
    assert sorted(first) == list(range(1, max(first) + 1)), "one entry per step, none lost"
    assert min(second) == resumed + 1, "the new segment starts right after the checkpoint"
    assert max(first) > resumed + 1, (
        "steps after the checkpoint were trained twice (the kill landed at step 35)"
    )
    for s in set(first) & set(second):
        assert (first[s].loss, first[s].arm, first[s].batch_sha256) == (
            second[s].loss,
            second[s].arm,
            second[s].batch_sha256,
        )
    assert_as_never_killed(tmp_path, loss_reference)


def test_random_sigkills_of_both_are_invisible(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    rng = random.Random(20261129)
    proxy = start_proxy(tmp_path)
    t = proxy_trainer(tmp_path, cache_dir)
    kills = 0
    deadline = time.monotonic() + 240
    while t.proc.poll() is None or proxy.proc.poll() is None:
        assert time.monotonic() < deadline, t.log + proxy.log
        time.sleep(rng.uniform(0.5, 2.5))
        if t.proc.poll() is not None:
            break
        victim = rng.choice(["trainer", "proxy"]) if kills < 4 else None
        if victim == "trainer":
            t.signal(signal.SIGKILL)
            t.wait()
            t = proxy_trainer(tmp_path, cache_dir)
            kills += 1
        elif victim == "proxy":
            proxy.signal(signal.SIGKILL)
            proxy.wait()
            proxy = start_proxy(tmp_path)
            kills += 1
        else:
            break
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert stop(proxy) == ExitCode.OK, proxy.log
    assert kills >= 2
    assert curve(tmp_path) == curve(reference)
    assert carried(tmp_path) == carried(reference)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (reference / bin_name(STEPS)).read_bytes()
    json.loads((tmp_path / ".state.json").read_text())


def test_sigterm_while_waiting_for_the_proxy_checkpoints_and_exits(
    tmp_path: Path, cache_dir: Path
) -> None:
    proxy = start_proxy(tmp_path)
    # No cadence: a slow machine can stall at a cadence step, whose checkpoint would then stand.
    t = proxy_trainer(tmp_path, cache_dir, "--max-steps", "100000", "--checkpoint-every", "0")
    t.wait_for(r"step 12/", timeout=WAIT)
    proxy.signal(signal.SIGKILL)
    proxy.wait()
    t.wait_for(r"waiting for the proxy", timeout=WAIT)
    t.signal(signal.SIGTERM)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    man = sorted(tmp_path.glob("step_*.json"))[-1]
    data = json.loads(man.read_text())
    assert data["trigger"] == "sigterm" and data["step"] >= 12
    # Records the proxy never acknowledged travel in the manifest and reach the log next time.
    pending = {e["step"] for e in data["pending_losses"]}
    logged = {e.step for e in read_entries(tmp_path / ".loss.json")}
    assert set(range(1, data["step"] + 1)) <= logged | pending


def test_samples_never_change_the_trajectory(tmp_path: Path, cache_dir: Path) -> None:
    def run(d: Path, every: str) -> list[tuple[int, float, str]]:
        res = forkserver.run(
            trainer_cmd(
                d,
                cache_dir,
                "--max-steps",
                "25",
                "--checkpoint-every",
                "0",
                "--sample-every",
                every,
            ),
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert res.returncode == 0, res.stderr
        return curve(d)

    with_samples = run(tmp_path / "a", "5")
    without = run(tmp_path / "b", "0")
    assert with_samples == without
    assert (tmp_path / "a" / bin_name(25)).read_bytes() == (
        tmp_path / "b" / bin_name(25)
    ).read_bytes()


def test_zombie_arm_never_draws_and_is_reported(
    tmp_path: Path, cache_dir: Path, reference: Path
) -> None:
    """The seed's lesson: a state carrying weight for an arm whose source is gone."""
    state = json.loads((reference / ".state.json").read_text())
    arm = dict(state["bandit"]["arms"][0])
    # Pulls stay 0 so that the phase counters of the doctored state remain consistent (and so
    # the arm has no loss statistics either): the history the log gives an arm never pulled,
    # which the state's check against .loss.json accepts.
    arm.update(
        name="repo-docstrings",
        identity="f" * 64,
        weight=1.546,
        pulls=0,
        ema_reward=0.0,
        probability=0.5,
        loss_ema=None,
        loss_best=None,
        progress_sum=0.0,
        progress_pulls=0.0,
        last_pull=0,
        first_loss=None,
        heldout=None,
        heldout_low=None,
        heldout_evals=0,
        forgotten=False,
        fall_rate=0.0,
        fall_pulls=0,
        recent_losses=[],
        recent_steps=[],
        first_step=0,
        cut_level=None,
        cut_step=0,
    )
    state["bandit"]["arms"].append(arm)
    state["bandit"]["arms"].sort(key=lambda a: a["name"])

    for name in ("run.toml", ".loss.json"):
        shutil.copy(reference / name, tmp_path / name)
    (tmp_path / ".state.json").write_text(json.dumps(state))
    proxy = start_proxy(tmp_path)
    proxy.wait_for(r"zombie arm 'repo-docstrings'", timeout=WAIT)
    proxy.wait_for(r"proxy ready", timeout=WAIT)
    reply = request(
        peer_endpoint(tmp_path, "proxy"), messages.StatusRequest(id=new_id()), timeout=5
    )
    assert stop(proxy) == ExitCode.OK, proxy.log
    assert reply.ok and reply.data["probabilities"]["repo-docstrings"] == 0.0
    assert [z["name"] for z in reply.data["zombies"]] == ["repo-docstrings"]
    saved = json.loads((tmp_path / ".state.json").read_text())
    assert [z["name"] for z in saved["zombies"]] == ["repo-docstrings"]
    assert any(
        a["name"] == "repo-docstrings" and a["weight"] == 1.546 for a in saved["bandit"]["arms"]
    )


def test_infeasible_policy_is_refused(tmp_path: Path, reference: Path) -> None:
    shutil.copy(reference / "run.toml", tmp_path / "run.toml")
    (tmp_path / "policy.toml").write_text(
        "[arms.code]\nfloor = 0.6\n[arms.comments]\nfloor = 0.6\n"
    )
    res = subprocess.run(proxy_cmd(tmp_path), capture_output=True, text=True, timeout=60)
    assert res.returncode == ExitCode.CONFIG_ERROR
    assert "floor" in res.stderr and "1.2" in res.stderr


def test_a_trainer_of_another_protocol_is_refused(tmp_path: Path, reference: Path) -> None:
    shutil.copy(reference / "run.toml", tmp_path / "run.toml")
    proxy = start_proxy(tmp_path)
    proxy.wait_for(r"proxy ready", timeout=WAIT)
    hello = messages.Hello(
        id=new_id(), protocol=messages.PROTOCOL + 1, resume_step=0, seed=0, arms=["code"]
    )
    reply = request(peer_endpoint(tmp_path, "proxy"), hello, timeout=10)
    assert isinstance(reply, messages.Reply) and not reply.ok
    assert f"protocol {messages.PROTOCOL + 1}, this proxy speaks {messages.PROTOCOL}" in reply.error
    assert stop(proxy) == ExitCode.OK, proxy.log
    assert "segment" not in proxy.log  # no life was numbered for it


def test_one_command_run_and_ctrl_c_stop_both_cleanly(tmp_path: Path, cache_dir: Path) -> None:
    """The README's main job: trainer and proxy from one command; Ctrl-C (SIGINT to the trainer,
    as a terminal sends it) checkpoints, lets the proxy log every record, and stops both."""
    t = Daemon(
        trainer_cmd(
            tmp_path, cache_dir, "--with-proxy", "--max-steps", "100000", "--checkpoint-every", "0"
        )
    )
    t.wait_for(r"step 15/", timeout=WAIT)
    t.signal(signal.SIGINT)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert "proxy stopped; state written" in t.log
    (man,) = [json.loads(p.read_text()) for p in tmp_path.glob("step_*.json")]
    assert man["trigger"] == "sigint"
    steps = [e.step for e in read_entries(tmp_path / ".loss.json")]
    assert steps == list(range(1, man["step"] + 1))
    lock = (tmp_path / ".proxy.lock").read_text()
    assert subprocess.run(["kill", "-0", lock], capture_output=True).returncode != 0, (
        "the proxy is gone"
    )
