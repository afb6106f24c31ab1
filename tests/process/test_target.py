"""A target reached by a pivot (the seed's manual path: a restart with `--policy TARGET --pivot`
at the newest checkpoint; the reward transfer-2) in the one-command mode: the probes its records
carry from the pivot on, and every restart path after it — SIGKILL and SIGTERM of the proxy,
SIGKILL and SIGTERM of the trainer — invisible in the result (final .bin bytes, canonical loss
curve, arms and probes), against the run never stopped."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from andrea.daemon.mixing.policy import TARGET_REWARD, parse_policy
from andrea.daemon.mixing.rewards.transfer import PROBE_EVERY
from andrea.daemon.rundir.layout import bin_name, lock_holder
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, trainer_cmd

STEPS = 48
#: The pivot's boundary: the first life trains this far without a target, and checkpoints.
PIVOT = 8
#: Seconds to wait for a log line on a loaded 2-core machine.
WAIT = 240
#: Two target arms, so that the mixture between them follows the probes (the third arm, not a
#: target, is not explored this early).
POLICY = 'target = ["code", "comments=0.5"]\nlag = 4\n'


def start(run: Path, cache: Path, *extra: str, steps: int = STEPS) -> Daemon:
    return Daemon(
        trainer_cmd(
            run,
            cache,
            "--with-proxy",
            *extra,
            "--max-steps",
            str(steps),
            "--checkpoint-every",
            "8",
            "--proxy-grace",
            "1",
        )
    )


def pivoted(run: Path, cache: Path, policy: Path) -> Daemon:
    """A run's first life without a target, to PIVOT, then the pivot to `policy`: its second life."""
    t = start(run, cache, "--policy", str(policy.with_name("plain.toml")), steps=PIVOT)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    return start(run, cache, "--policy", str(policy), "--pivot")


def probes(run: Path) -> dict[int, dict[str, float]]:
    """The probe each step's first record carries, as the bandit reads it."""
    out: dict[int, dict[str, float]] = {}
    for e in read_entries(run / ".loss.json"):
        if e.probe is not None:
            out.setdefault(e.step, e.probe)
    return out


def result(run: Path) -> tuple[list[tuple[int, float, str]], dict[int, dict[str, float]], bytes]:
    curve = [(e.step, e.loss, e.arm) for e in canonical_curve(read_entries(run / ".loss.json"))]
    return curve, probes(run), (run / bin_name(STEPS)).read_bytes()


def proxy_pid(run: Path) -> int:
    deadline = time.monotonic() + WAIT
    while (pid := lock_holder(run, "proxy")) is None:
        assert time.monotonic() < deadline, "no proxy holds the run"
        time.sleep(0.2)
    return pid


def test_a_pivot_to_a_target_survives_every_restart_bit_for_bit(
    tmp_path: Path, cache_dir: Path
) -> None:
    policy = tmp_path / "target.toml"
    policy.write_text(POLICY)
    (tmp_path / "plain.toml").write_text("lag = 4\n")
    reference = tmp_path / "reference"
    t = pivoted(reference, cache_dir, policy)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert f"target probes: {(STEPS - PIVOT) // PROBE_EVERY}," in t.log, t.log
    assert parse_policy((reference / "policy.toml").read_text()).reward == TARGET_REWARD
    curve, carried, _ = result(reference)
    assert [s for s, _, _ in curve] == list(range(1, STEPS + 1))
    assert sorted(carried) == list(range(PIVOT + PROBE_EVERY, STEPS + 1, PROBE_EVERY))
    assert all(set(p) == {"code", "comments"} for p in carried.values())
    assert {a for s, _, a in curve if s > PIVOT} == {"code", "comments"}

    run = tmp_path / "stopped"
    t = pivoted(run, cache_dir, policy)
    t.wait_for(r"step 10/", WAIT)
    pid = proxy_pid(run)
    # The proxy crashes: the trainer starts another, which replays the log.
    signal_and_wait(pid, signal.SIGKILL)
    t.wait_for(r"andrea-proxy exited with signal SIGKILL; restarting it", WAIT)
    t.wait_for(r"step 18/", WAIT)
    # A person stops the proxy: after the grace the trainer starts its own again.
    signal_and_wait(proxy_pid(run), signal.SIGTERM)
    t.wait_for(r"step 26/", WAIT)
    t.signal(signal.SIGKILL)
    t.wait(WAIT)
    wait_gone(run)
    # The restarts name no policy: the run keeps the one in force, the pivot's.
    t = start(run, cache_dir)
    t.wait_for(r"resumed from step_", WAIT)
    t.wait_for(r"step 36/", WAIT)
    t.signal(signal.SIGTERM)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    wait_gone(run)
    t = start(run, cache_dir)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert result(run) == result(reference)


def signal_and_wait(pid: int, sig: signal.Signals) -> None:
    import os

    os.kill(pid, sig)
    deadline = time.monotonic() + WAIT
    while Path(f"/proc/{pid}").exists() and _state(pid) not in "ZX":
        assert time.monotonic() < deadline, f"pid {pid} did not exit"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def wait_gone(run: Path) -> None:
    """Until no proxy of `run` is left (the killed trainer's proxy ends with it)."""
    deadline = time.monotonic() + WAIT
    while lock_holder(run, "proxy") is not None:
        assert time.monotonic() < deadline, "the proxy outlived its trainer"
        time.sleep(0.2)
