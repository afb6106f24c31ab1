"""The seed's manual pivot in the one-command mode (`andrea-trainer --with-proxy`): the four
commands of docs/operations.md, read from it and run by a real shell, with the trainer running
throughout. The trainer tells a person's stop of its proxy from a crash, uses the proxy the person
starts, and never ends the run over it."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

from andrea.daemon.rundir.layout import lock_holder
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import REPO, Daemon, trainer_cmd

#: Seconds to wait for a log line: generous, for a loaded 2-core machine.
WAIT = 300
#: Long enough for the shell to start andrea-proxy on a loaded machine (over 20 s was seen once, on
#: a machine about 4 times slower per step than 2026-12-05's), short enough to wait out: the test
#: waits it out once, the longest wait of the suite.
GRACE = 30
EVERY = 25
BASE = "[arms.comments]\ncap = 0.5\n"
# Caps of 0 leave docstrings as the only arm: every step of the new phase must come from it.
POLISH = "[arms.code]\ncap = 0.0\n[arms.comments]\ncap = 0.0\n"


def seed_sequence() -> str:
    """The manual path's commands, as docs/operations.md gives them to type in a terminal."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("### The manual path", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return "\n".join(line for line in lines if line)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in "ZX"


def test_the_seed_manual_pivot_in_one_command_mode(tmp_path: Path, cache_dir: Path) -> None:
    commands = seed_sequence()
    assert commands.splitlines() == [
        "kill -USR1 $(cat RUN/.trainer.lock)",
        "kill -TERM $(cat RUN/.proxy.lock)",
        "cp polish.toml RUN/policy.toml",
        "andrea-proxy --run-dir RUN &",
    ]
    run = tmp_path / "run"
    (tmp_path / "base.toml").write_text(BASE)
    (tmp_path / "polish.toml").write_text(POLISH)
    t = Daemon(
        trainer_cmd(run, cache_dir, "--with-proxy", "--policy", str(tmp_path / "base.toml"),
                    "--proxy-grace", str(GRACE), "--max-steps", "100000",
                    "--checkpoint-every", str(EVERY))
    )  # fmt: skip
    t.wait_for(r"step 12/", timeout=WAIT)
    own = lock_holder(run, "proxy")
    assert own is not None and alive(own)

    # The operator's terminal: the four commands, RUN being the run directory; `wait` keeps the
    # shell (and so the log of the proxy it starts) until that proxy exits.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    shell = Daemon(
        ["bash", "-c", commands.replace("RUN", str(run)) + "\nwait"], env=env, cwd=tmp_path
    )
    t.wait_for(r"stopped cleanly without the trainer asking: a person stopped it", timeout=WAIT)
    adopted = int(t.wait_for(r"andrea-proxy \(pid (\d+)\), started by hand, serves", WAIT)[1])
    assert adopted != own and not alive(own)
    boundary = int(shell.wait_for(r"a pivot after the newest checkpoint, step (\d+)", WAIT)[1])
    t.wait_for(rf"rolling back to step_{boundary:06d}\.bin", timeout=WAIT)
    t.wait_for(rf"step {boundary + 2 * EVERY}/", timeout=WAIT)  # it kept training
    assert "another andrea-proxy" not in shell.log + t.log
    assert t.log.count("starting andrea-proxy") == 1, "the trainer started no proxy of its own"
    assert (run / "policy.toml").read_text().endswith(POLISH)
    assert list((run / "archive").glob("pivot-*/pivot.json"))

    # The proxy started by hand goes away: after the grace the trainer starts its own, under the
    # pivoted policy (its first start's --policy base.toml would undo the pivot or be refused).
    os.kill(adopted, signal.SIGTERM)
    assert shell.wait(WAIT) == 0, shell.log
    t.wait_for(rf"started by hand, has exited; waiting up to {GRACE} s", timeout=WAIT)
    t.wait_for(rf"no andrea-proxy was started within {GRACE} s", timeout=WAIT)
    t.wait_for(r"under the run's policy in force", timeout=WAIT)
    restarted = max(e.step for e in read_entries(run / ".loss.json"))
    t.wait_for(rf"step {restarted + EVERY}/", timeout=WAIT)
    last = lock_holder(run, "proxy")
    assert last not in (None, own, adopted) and alive(last)

    t.signal(signal.SIGTERM)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert not alive(last), "no proxy outlives the one command"
    curve = canonical_curve(read_entries(run / ".loss.json"))
    assert [e.step for e in curve] == list(range(1, len(curve) + 1))
    after = [e for e in curve if e.step > boundary]
    assert after and {e.phase for e in after} == {1} and {e.arm for e in after} == {"docstrings"}
    assert {e.phase for e in curve if e.step <= boundary} == {0}


def test_a_proxy_started_by_hand_is_used_and_stopped_with_the_trainer(
    tmp_path: Path, cache_dir: Path
) -> None:
    """The one command's proxy does not outlive a killed trainer (it stops cleanly); a proxy
    already running when `--with-proxy` starts (left by the manual path after the trainer was
    killed, say) is used, not fought over, and the one command's stop ends it."""
    run = tmp_path / "run"
    t = Daemon(trainer_cmd(run, cache_dir, "--with-proxy", "--max-steps", "100000"))
    t.wait_for(r"step 3/", timeout=WAIT)
    child = lock_holder(run, "proxy")
    assert child is not None
    t.signal(signal.SIGKILL)
    t.wait(WAIT)
    deadline = time.monotonic() + WAIT
    while alive(child):  # the trainer's own proxy does not outlive it
        assert time.monotonic() < deadline, "the proxy outlived its trainer"
        time.sleep(0.1)
    json.loads((run / ".state.json").read_text())  # it stopped cleanly, writing its state
    p = Daemon([sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run)])
    p.wait_for(r"proxy ready", timeout=WAIT)
    t = Daemon(trainer_cmd(run, cache_dir, "--with-proxy", "--max-steps", "100000"))
    t.wait_for(rf"andrea-proxy \(pid {p.proc.pid}\), started by hand, serves", timeout=WAIT)
    t.wait_for(r"step 8/", timeout=WAIT)
    assert "starting andrea-proxy" not in t.log
    t.signal(signal.SIGINT)
    assert t.wait(WAIT) == ExitCode.OK, t.log
    assert p.wait(60) == ExitCode.OK, p.log
    assert "proxy stopped; state written" in p.log
