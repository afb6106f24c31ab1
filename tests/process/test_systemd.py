"""The units under a real systemd (PID 1 of private namespaces, tests/support/realsystemd.py), installed by
scripts/install-units.sh and driven with systemctl the way an operator drives them.

One machine for the module. The tests on run RUN follow each other in file order (start, steer,
crash, stop, restart); every other scenario has a run of its own. Timeouts are shortened by
drop-ins, so that a crash loop or a watchdog shows within seconds, not minutes. The trainers are
paced by a drop-in (ANDREA_TEST_STEP_PAUSE: a sleep after each step): the tests wait for events,
not for steps, and an unpaced andrea-tiny trains flat out meanwhile, a core for each trainer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from andrea.daemon.config import build_config
from andrea.daemon.data.arms import load_arms
from andrea.daemon.data.encoding import PACE_ENV as ENCODE_PACE_ENV
from andrea.daemon.trainer.loop import PACE_ENV
from tests.support.manifests import final_trigger_is
from tests.support.owndata import PROSE, bpe_file
from tests.support.realsystemd import REPO, SystemdMachine

RUN = f"r{os.getpid()}"  # unique: other test machines may share the cgroup tree
TINY = "--preset andrea-tiny --threads 1 --log-every 10 --sample-every 0"
ANDREACTL = f"{REPO}/.venv/bin/andreactl"
#: Caps of 0 leave docstrings as the only arm: every step of the new phase comes from it.
POLICY = "[arms.code]\ncap = 0.0\n[arms.comments]\ncap = 0.0\n"
#: Text files of 0.11 MB each, two batches of the encoder (4 MiB, then the rest), with a pause
#: between them: an encoding that outlasts a start timeout of 3 s on any machine. Unpaced, an idle
#: machine encoded four times as much in 4 s, and the test failed there.
ENCODE_FILES = 48
ENCODE_PAUSE = 8
#: Seconds each trainer sleeps after a step: 20 steps a second at most, a few percent of a core.
PACE = 0.05


def trainer(run: str) -> str:
    return f"andrea-trainer@{run}.service"


def proxy(run: str) -> str:
    return f"andrea-proxy@{run}.service"


def state_dir(run: str) -> str:
    return f"/var/lib/andrea/{run}"


@pytest.fixture(scope="module")
def sd(real_systemd: SystemdMachine, cache_dir: Path) -> SystemdMachine:
    m = real_systemd
    for unit in ("andrea-trainer@.service", "andrea-proxy@.service"):
        m.write_dropin(unit, "test", "[Service]\nRestartSec=1s\n")
    for unit in ("andrea-trainer@.service", "andrea-trainer-ddp@.service"):
        m.write_dropin(unit, "pace", f"[Service]\nEnvironment={PACE_ENV}={PACE}\n")
    # The session's tokenized corpus (built here if no test did yet), so that a first start does
    # not rebuild it: the start-up times asserted below are the daemons', not tokenizing's (a cold
    # first start is measured in docs/operations.md).
    if not any(cache_dir.glob("*.u8")):
        cfg = build_config({}, {"preset": "andrea-tiny", "data": {"cache_dir": str(cache_dir)}})
        load_arms(cfg.data, cache_dir, cfg.model.vocab_size)
    cache = m.path("/var/cache/andrea")
    cache.mkdir(parents=True, exist_ok=True)
    for f in cache_dir.iterdir():  # a split arm is three files, its .u8 written last
        if f.is_file():
            shutil.copy(f, cache / f.name)
    m.sh("chown -R andrea:andrea /var/cache/andrea", check=True)
    m.write_env(RUN, f'ANDREA_TRAINER_ARGS="{TINY} --max-steps 100000 --checkpoint-every 20"')
    m.daemon_reload()
    return m


def ctl(m: SystemdMachine, run: str, *args: str, timeout: float = 120):
    """andreactl from a plain root shell: no ANDREA_SOCKET_DIR, nothing but --run-dir."""
    cmd = " ".join([ANDREACTL, "--run-dir", state_dir(run), *args])
    return m.sh(cmd, timeout=timeout)


def manifests(m: SystemdMachine, run: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(m.path(state_dir(run)).glob("step_*.json"))]


def step(m: SystemdMachine, run: str, unit: str | None = None) -> int:
    """The trainer's step from its STATUS= line (`systemctl status` shows the same)."""
    found = re.match(r"step (\d+)", m.prop(unit or trainer(run), "StatusText"))
    return int(found.group(1)) if found else -1


def wait_step(
    m: SystemdMachine, run: str, at_least: int, timeout: float = 60, unit: str | None = None
) -> int:
    m.wait_until(lambda: step(m, run, unit) >= at_least, timeout, f"{run} to pass step {at_least}")
    return step(m, run, unit)


def timed(m: SystemdMachine, cmd: str, timeout: float = 180) -> float:
    t0 = time.monotonic()
    m.sh(cmd, timeout=timeout, check=True)
    return time.monotonic() - t0


# ---- one run, start to stop -----------------------------------------------------------------


def test_first_start_is_active_within_30_s(sd: SystemdMachine) -> None:
    took = timed(sd, f"systemctl start andrea@{RUN}.target")
    # The proxy is ready before it waits for run.toml, so the trainer ordered after it starts at
    # once and writes the file: no start timeout is waited out (it was 97 s).
    assert took < 30, f"{took:.1f} s"
    for unit in (trainer(RUN), proxy(RUN)):
        assert sd.prop(unit, "ActiveState") == "active", sd.journal(unit)
    wait_step(sd, RUN, 1)
    assert f"{PACE_ENV}: pausing {PACE:g} s after each step" in sd.journal(trainer(RUN))
    # Unprivileged: the daemons run as the system user the install script made.
    pid = sd.prop(trainer(RUN), "MainPID")
    assert sd.sh(f"ps -o user= -p {pid}").stdout.strip() == "andrea"
    sockets = sd.sh(f"stat -c '%U %a' /run/andrea/{RUN}").stdout.split()
    assert sockets == ["andrea", "700"]


def test_enable_starts_the_run_at_every_boot(sd: SystemdMachine) -> None:
    sd.systemctl("enable", f"andrea@{RUN}.target")
    # What boot reads (multi-user.target wants the run); this machine's /etc is its own copy.
    wants = sd.path(f"/etc/systemd/system/multi-user.target.wants/andrea@{RUN}.target")
    assert wants.is_symlink() and Path(os.readlink(wants)).name == "andrea@.target"


def test_andreactl_status_from_a_plain_shell(sd: SystemdMachine) -> None:
    res = ctl(sd, RUN, "--json", "status")
    assert res.returncode == 0, res.stdout + res.stderr
    status = json.loads(res.stdout)
    assert status["trainer"]["pid"] == int(sd.prop(trainer(RUN), "MainPID"))
    assert status["proxy"] is not None, status


def test_journalctl_finds_a_step_by_its_field(sd: SystemdMachine) -> None:
    """`journalctl -u andrea-trainer@RUN STEP=N` finds step N's progress line, whose LOSS, LR, ARM
    and PHASE fields are .loss.json's (the trainer logs every 10 steps here)."""
    at = wait_step(sd, RUN, 20) // 10 * 10
    loss_json = sd.path(state_dir(RUN)) / ".loss.json"
    sd.wait_until(
        lambda: any(e["step"] == at for e in json.loads(loss_json.read_text())), 60, "the entry"
    )
    out = sd.sh(f"journalctl --no-pager -o json -u {trainer(RUN)} STEP={at}").stdout
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["MESSAGE"].startswith(f"step {at}/100000 | loss ")
    (entry,) = [e for e in json.loads(loss_json.read_text()) if e["step"] == at]
    assert float(record["LOSS"]) == pytest.approx(entry["loss"], rel=1e-5)
    assert float(record["LR"]) == pytest.approx(entry["lr"], rel=1e-5)
    assert (record["ARM"], int(record["PHASE"])) == (entry["arm"], entry["phase"])


def test_reload_returns_once_the_checkpoint_is_durable(sd: SystemdMachine) -> None:
    before = {x["step"] for x in manifests(sd, RUN)}
    sd.systemctl("reload", trainer(RUN))
    new = [x for x in manifests(sd, RUN) if x["step"] not in before]
    assert any(x["trigger"] == "control" for x in new), new


def test_sigusr1_checkpoints_and_training_goes_on(sd: SystemdMachine) -> None:
    pid = sd.prop(trainer(RUN), "MainPID")
    sd.systemctl("kill", "-s", "SIGUSR1", "--kill-whom=main", trainer(RUN))
    sd.wait_until(
        lambda: any(x["trigger"] == "sigusr1" for x in manifests(sd, RUN)),
        60,
        "the SIGUSR1 checkpoint",
    )
    assert sd.prop(trainer(RUN), "MainPID") == pid


def test_proxy_restart_leaves_the_trainer_alone(sd: SystemdMachine) -> None:
    t_pid, p_pid = sd.prop(trainer(RUN), "MainPID"), sd.prop(proxy(RUN), "MainPID")
    sd.systemctl("restart", proxy(RUN))
    assert sd.prop(proxy(RUN), "MainPID") != p_pid
    now = step(sd, RUN)
    wait_step(sd, RUN, now + 5)
    assert sd.prop(trainer(RUN), "MainPID") == t_pid
    assert sd.prop(trainer(RUN), "NRestarts") == "0"


def test_andreactl_pivot_from_a_plain_shell(sd: SystemdMachine) -> None:
    sd.path("/tmp/polish.toml").write_text(POLICY)
    res = ctl(sd, RUN, "pivot", "--policy", "/tmp/polish.toml")
    assert res.returncode == 0, res.stdout + res.stderr + sd.journal(trainer(RUN), proxy(RUN))
    status = json.loads(ctl(sd, RUN, "--json", "status").stdout)
    assert status["proxy"]["phase"] == 1, status


def test_sigkill_restarts_and_resumes(sd: SystemdMachine) -> None:
    pid, p_pid = sd.prop(trainer(RUN), "MainPID"), sd.prop(proxy(RUN), "MainPID")
    sd.systemctl("kill", "-s", "SIGKILL", "--kill-whom=main", trainer(RUN))
    sd.wait_until(
        lambda: (
            sd.prop(trainer(RUN), "NRestarts") == "1"
            and sd.prop(trainer(RUN), "ActiveState") == "active"
        ),
        60,
        "systemd to restart the trainer",
    )
    assert sd.prop(trainer(RUN), "MainPID") != pid
    assert sd.prop(proxy(RUN), "MainPID") == p_pid
    log = sd.journal(trainer(RUN))
    resumed = re.findall(r"resumed from step_(\d+)\.bin", log)
    assert resumed, log[-3000:]
    wait_step(sd, RUN, int(resumed[-1]) + 5)


def stop_target(m: SystemdMachine, run: str) -> None:
    """Stop the run's target and wait for both daemons: `systemctl stop` of the target returns
    once the target itself is down (it is ordered after the daemons, so that a start returns only
    once both are READY), while the trainer may still be writing its final checkpoint."""
    m.systemctl("stop", f"andrea@{run}.target")
    m.wait_until(
        lambda: all(
            m.prop(u, "ActiveState") in ("inactive", "failed") for u in (trainer(run), proxy(run))
        ),
        120,
        "both daemons to stop",
    )


def test_target_stop_exits_0_with_one_loss_entry_per_step(sd: SystemdMachine) -> None:
    stop_target(sd, RUN)
    for unit in (trainer(RUN), proxy(RUN)):
        props = sd.show(unit, "ActiveState", "Result", "ExecMainStatus")
        assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, (
            props,
            sd.journal(unit)[-3000:],
        )
    final = manifests(sd, RUN)[-1]
    assert final_trigger_is("sigterm", final, sd.journal(trainer(RUN))), final
    entries = json.loads(sd.path(f"{state_dir(RUN)}/.loss.json").read_text())
    pairs = [(e["segment"], e["step"]) for e in entries]
    assert len(pairs) == len(set(pairs)), "a (segment, step) logged twice"
    canonical: dict[int, dict] = {}
    for e in entries:  # the newest life's entry of each step counts
        if e["step"] not in canonical or e["segment"] > canonical[e["step"]]["segment"]:
            canonical[e["step"]] = e
    assert sorted(s for s in canonical if s <= final["step"]) == list(range(1, final["step"] + 1))
    # The last life logged exactly up to the final checkpoint. Steps past it can only be those
    # the SIGKILLed life trained after its last checkpoint (the audit trail keeps them).
    last = max(e["segment"] for e in entries)
    assert max(e["step"] for e in entries if e["segment"] == last) == final["step"]
    assert all(e["segment"] < last for e in entries if e["step"] > final["step"])
    # The pivot's new phase trained only from the one arm its policy leaves.
    assert {e["arm"] for e in canonical.values() if e["phase"] == 1} == {"docstrings"}


def test_restart_of_a_stopped_run_is_active_within_30_s(sd: SystemdMachine) -> None:
    final = manifests(sd, RUN)[-1]["step"]
    took = timed(sd, f"systemctl start andrea@{RUN}.target")
    assert took < 30, f"{took:.1f} s"
    assert f"resumed from step_{final:06d}.bin" in sd.journal(trainer(RUN))
    wait_step(sd, RUN, final + 1)
    stop_target(sd, RUN)


def test_manual_pivot_with_systemctl_stop_and_start(sd: SystemdMachine) -> None:
    """The seed's sequence under systemd, with the trainer running throughout: a checkpoint
    (the synchronous reload), stop the proxy, put the new policy in place, start the proxy. The
    trainer, never restarted, rolls back to the newest checkpoint by itself."""
    sd.systemctl("start", f"andrea@{RUN}.target")
    wait_step(sd, RUN, manifests(sd, RUN)[-1]["step"] + 2)
    pid = sd.prop(trainer(RUN), "MainPID")
    sd.systemctl("reload", trainer(RUN))
    sd.systemctl("stop", proxy(RUN))
    phase = json.loads(sd.path(f"{state_dir(RUN)}/.state.json").read_text())["bandit"]["phase"]
    policy = sd.path(f"{state_dir(RUN)}/policy.toml")
    policy.write_text("[arms.docstrings]\ncap = 0.2\n")
    sd.sh(f"chown andrea:andrea {state_dir(RUN)}/policy.toml", check=True)
    said = r"a pivot after the newest checkpoint, step (\d+)"
    before = len(re.findall(said, sd.journal(proxy(RUN))))
    sd.systemctl("start", proxy(RUN))
    units = (trainer(RUN), proxy(RUN))
    sd.wait_until(
        lambda: len(re.findall(said, sd.journal(proxy(RUN)))) > before,
        120,
        "the proxy's pivot",
        show=units,
    )
    boundary = int(re.findall(said, sd.journal(proxy(RUN)))[-1])
    sd.wait_until(
        lambda: f"rolling back to step_{boundary:06d}.bin" in sd.journal(trainer(RUN)),
        120,  # both units on a loaded 2-core machine, the whole suite beside them
        "the trainer's roll-back",
        show=units,
    )
    wait_step(sd, RUN, boundary + 5)
    status = json.loads(ctl(sd, RUN, "--json", "status").stdout)
    assert status["proxy"]["phase"] == phase + 1
    assert status["proxy"]["phase_start_step"] == boundary
    assert sd.prop(trainer(RUN), "MainPID") == pid, "no operator restart of the trainer"
    stop_target(sd, RUN)


# ---- failures that must not loop, and one that must ------------------------------------------


def test_config_error_is_not_restarted(sd: SystemdMachine) -> None:
    run = f"{RUN}c"
    sd.write_env(run, 'ANDREA_TRAINER_ARGS="--preset andrea-nonexistent"')
    sd.sh(f"systemctl start {trainer(run)}")
    sd.wait_until(lambda: sd.prop(trainer(run), "ActiveState") == "failed", 60, "the exit")
    time.sleep(3)  # three RestartSec: a restart would have happened by now
    props = sd.show(trainer(run), "ActiveState", "NRestarts", "ExecMainStatus")
    assert props == {"ActiveState": "failed", "NRestarts": "0", "ExecMainStatus": "2"}, props
    # The reason reaches `journalctl -u` however fast the process exits: through the stream systemd
    # opened for the unit (a native datagram from a process already gone has no unit), as an error.
    lines = [json.loads(x) for x in sd.journal(trainer(run), output="json").splitlines()]
    reason = [x for x in lines if "andrea-nonexistent" in x.get("MESSAGE", "")]
    assert [(x["_TRANSPORT"], x["PRIORITY"]) for x in reason] == [("stdout", "3")], reason


def test_crash_loop_stops_at_the_start_limit(sd: SystemdMachine) -> None:
    run = f"{RUN}l"
    # An interpreter that dies at once with exit 1, before any of the daemon's code runs: the
    # kind of crash no exit-code mapping can classify, so only the start limit ends it.
    sd.write_env(run, "PYTHONHASHSEED=not-a-number")
    sd.sh(f"systemctl start {trainer(run)}")
    refused = "Start request repeated too quickly"
    sd.wait_until(lambda: refused in sd.journal(trainer(run)), 90, "the start limit")
    # What the operator sees: the unit failed, and why it is not restarted any more.
    status = sd.sh(f"systemctl status --no-pager {trainer(run)}").stdout
    assert "failed" in status and refused in status, status
    restarts = sd.prop(trainer(run), "NRestarts")
    time.sleep(3)  # three RestartSec: nothing more happens
    assert sd.show(trainer(run), "ActiveState", "NRestarts") == {
        "ActiveState": "failed",
        "NRestarts": restarts,
    }
    # StartLimitBurst=5: five starts ran, the sixth was refused.
    assert restarts == "5"


def test_watchdog_and_a_slow_final_checkpoint(sd: SystemdMachine) -> None:
    """A synchronous checkpoint slower than the watchdog keeps the unit alive; a hung trainer is
    caught by the watchdog, restarted and resumed; a final checkpoint slower than TimeoutStopSec
    still ends in exit 0, because the trainer keeps extending the stop timeout while it writes."""
    run = f"{RUN}w"
    delay, stop_timeout = 6, 3
    sd.write_dropin(
        trainer(run),
        "slow",
        f"[Service]\nWatchdogSec=4s\nTimeoutStopSec={stop_timeout}s\n"
        f"Environment=ANDREA_CKPT_TEST_WRITE_DELAY={delay}\n",
    )
    sd.daemon_reload()
    sd.write_env(
        run,
        f'ANDREA_TRAINER_ARGS="{TINY} --mixing fixed --max-steps 100000 --checkpoint-every 0"',
    )
    sd.systemctl("start", trainer(run))
    wait_step(sd, run, 3)

    took = timed(sd, f"systemctl reload {trainer(run)}")
    assert took >= delay, f"{took:.1f} s"
    assert sd.prop(trainer(run), "NRestarts") == "0", sd.journal(trainer(run))[-3000:]
    saved = manifests(sd, run)[-1]["step"]

    sd.systemctl("kill", "-s", "SIGSTOP", "--kill-whom=main", trainer(run))
    sd.wait_until(
        lambda: (
            sd.prop(trainer(run), "NRestarts") == "1"
            and sd.prop(trainer(run), "ActiveState") == "active"
        ),
        90,
        "the watchdog to restart the hung trainer",
    )
    log = sd.journal(trainer(run))
    assert "Watchdog timeout" in log, log[-3000:]
    assert f"resumed from step_{saved:06d}.bin" in log, log[-3000:]

    wait_step(sd, run, saved + 3)
    took = timed(sd, f"systemctl stop {trainer(run)}")
    props = sd.show(trainer(run), "Result", "ExecMainStatus")
    assert props == {"Result": "success", "ExecMainStatus": "0"}, (props, sd.journal(trainer(run)))
    assert took > stop_timeout, f"{took:.1f} s: the write was not slow enough to test anything"
    final = manifests(sd, run)[-1]
    assert final["trigger"] == "sigterm" and final["step"] > saved


def _encoded(status: str) -> bool:
    """Whether a STATUS= line says an encoding is under way with documents encoded."""
    found = re.search(r"encoding, .* read, ([\d,]+) documents\)", status)
    return bool(found) and int(found.group(1).replace(",", "")) > 0


def test_a_first_start_encoding_past_its_start_timeout_trains_and_a_restart_continues_it(
    sd: SystemdMachine,
) -> None:
    """A first start whose encoding outlasts TimeoutStartSec= is not killed: the trainer tells
    systemd how it advances (EXTEND_TIMEOUT_USEC, the progress in STATUS=). A restart half-way
    (a SIGTERM) keeps what was encoded, and the next life continues it to training, no restart
    by systemd. Before, the start timed out, and each restart began the encoding from nothing."""
    run = f"{RUN}e"
    timeout = 3
    sd.write_dropin(
        trainer(run),
        "encode",
        f"[Service]\nTimeoutStartSec={timeout}s\nEnvironment={ENCODE_PACE_ENV}={ENCODE_PAUSE}\n",
    )
    sd.daemon_reload()
    home = sd.path(state_dir(run))
    (home / "notes").mkdir(parents=True)
    bpe_file(home / "tokenizer.json", [PROSE * 10])
    for i in range(ENCODE_FILES):
        (home / "notes" / f"n{i:03d}.txt").write_text(f"{i} {PROSE}" * 600)
    (home / "run.toml").write_text(
        '[data]\ntokenizer = "tokenizer.json"\n'
        '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.txt"]\n'
    )
    sd.sh(f"chown -R andrea:andrea {state_dir(run)}", check=True)
    sd.write_env(
        run, f'ANDREA_TRAINER_ARGS="{TINY} --mixing fixed --max-steps 100000 --checkpoint-every 0"'
    )
    unit = trainer(run)
    started = time.monotonic()
    sd.systemctl("start", "--no-block", unit)
    # Past its start timeout, still encoding, some documents encoded, and systemd still waits
    # for READY=1.
    sd.wait_until(
        lambda: time.monotonic() - started > timeout + 1 and _encoded(sd.prop(unit, "StatusText")),
        60,
        "the encoding to outlast the start timeout",
        show=(unit,),
    )
    assert sd.prop(unit, "ActiveState") == "activating", sd.journal(unit)[-3000:]
    sd.systemctl("restart", unit)  # returns once the new life is READY
    props = sd.show(unit, "ActiveState", "NRestarts")
    assert props == {"ActiveState": "active", "NRestarts": "0"}, (props, sd.journal(unit)[-3000:])
    log = sd.journal(unit)
    assert "timed out" not in log, log[-3000:]
    kept = re.search(r"arm notes: continuing the encoding .*: its first ([\d,]+) documents.*", log)
    assert kept and int(kept.group(1).replace(",", "")) > 0, log[-3000:]
    print(kept.group(0))
    assert log.count("encoding arm notes") == 2, "one encoding, begun once, continued once"
    wait_step(sd, run, 1)
    sd.systemctl("stop", unit)


# ---- data parallel: the torchrun unit ----------------------------------------------------------


def test_torchrun_unit_starts_reloads_stops_and_resumes(sd: SystemdMachine) -> None:
    """andrea-trainer-ddp@ with two gloo ranks on CPU, as docs/distributed.md runs it: READY from
    rank 0 through torchrun, a synchronous reload that checkpoints both ranks at one step, a stop
    through the control socket that ends in success (a SIGTERM would make torchrun exit 1), and a
    start that resumes the same two-rank run."""
    run = f"{RUN}d"
    unit = f"andrea-trainer-ddp@{run}.service"
    sd.write_env(
        run,
        "ANDREA_NPROC=2",
        f'ANDREA_TRAINER_ARGS="{TINY} --max-steps 100000 --checkpoint-every 50"',
    )
    sd.systemctl("start", proxy(run), unit, timeout=180)
    assert sd.prop(unit, "ActiveState") == "active", sd.journal(unit)
    torchrun = sd.prop(unit, "MainPID")
    workers = sd.sh(f"pgrep -u andrea -P {torchrun} -f andrea-trainer").stdout.split()
    assert len(workers) == 2, sd.sh("ps -ef").stdout
    at = wait_step(sd, run, 3, unit=unit)

    sd.systemctl("reload", unit)
    reloaded = manifests(sd, run)[-1]
    # A reload at a step the cadence (every 50) has just checkpointed is served by that checkpoint
    # (a loaded machine trained from step 3 to 50 while andreactl started).
    served = reloaded["trigger"] == "control" or (
        reloaded["trigger"] == "cadence" and reloaded["step"] % 50 == 0
    )
    assert served and reloaded["step"] >= at, reloaded
    assert reloaded["environment"]["world_size"] == 2
    assert [r["rank"] for r in reloaded["distributed"]["ranks"]] == [0, 1]

    wait_step(sd, run, reloaded["step"] + 2, unit=unit)
    sd.systemctl("stop", unit, timeout=300)
    props = sd.show(unit, "ActiveState", "Result", "ExecMainStatus")
    assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, (
        props,
        sd.journal(unit)[-3000:],
    )
    final = manifests(sd, run)[-1]
    # A stop at a step the cadence (every 50) has just checkpointed is served by that checkpoint.
    served = final["trigger"] == "control" or (
        final["trigger"] == "cadence" and final["step"] % 50 == 0
    )
    assert served and final["step"] > reloaded["step"], final

    sd.systemctl("start", unit, timeout=180)
    assert f"resumed from step_{final['step']:06d}.bin" in sd.journal(unit)
    wait_step(sd, run, final["step"] + 1, unit=unit)
    sd.systemctl("stop", unit, proxy(run), timeout=300)
    assert sd.show(unit, "Result", "ExecMainStatus") == {"Result": "success", "ExecMainStatus": "0"}


def test_torchrun_unit_with_a_broken_config_fails_once_with_its_reason(sd: SystemdMachine) -> None:
    """torchrun reports a worker's exit 2 as 1, which the unit would restart until its start limit.
    The preflight (`andrea-trainer --check`, first in ExecStart=) exits 2 itself, before torchrun
    runs: the unit fails after one start, its reason in the journal, and is not restarted."""
    run = f"{RUN}p"
    unit = f"andrea-trainer-ddp@{run}.service"
    sd.write_dropin(unit, "fast", "[Service]\nRestartSec=1s\n")
    sd.daemon_reload()
    # Four sequences per micro-batch cannot be shared by three ranks.
    sd.write_env(run, "ANDREA_NPROC=3", f'ANDREA_TRAINER_ARGS="{TINY} --grad-accum 2"')
    sd.sh(f"systemctl start {unit}", timeout=120)
    sd.wait_until(lambda: sd.prop(unit, "ActiveState") == "failed", 60, "the unit to fail")
    time.sleep(3)  # three RestartSec: a restart would have happened by now
    props = sd.show(unit, "ActiveState", "NRestarts", "Result", "ExecMainStatus")
    assert props == {
        "ActiveState": "failed",
        "NRestarts": "0",
        "Result": "exit-code",
        "ExecMainStatus": "2",
    }, (props, sd.journal(unit)[-3000:])
    log = sd.journal(unit)
    assert "which a job of 3 ranks cannot share equally" in log, log[-3000:]
    assert "world sizes 1, 2 or 4 would work" in log, log[-3000:]
    ps = sd.sh("ps -ef").stdout.splitlines()
    assert not [line for line in ps if "torchrun" in line and run in line], ps
    assert log.count("cannot share equally") == 1, "one start, one refusal"
