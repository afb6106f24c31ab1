"""andreactl's conventions that only a real process shows (tests/unit/test_cli_conventions.py has
the rest): user errors in one line without a traceback, status of a stopped run at once and
creating nothing, watch explaining the reward once, and the commands that must not import torch
or matplotlib."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from andrea.control.commands.conventions import EXIT_STOPPED
from andrea.control.reports import StatusReport
from tests.support.daemons import andreactl
from tests.support.reports import RFC3339


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return andreactl(None, *args, env={**os.environ, **(env or {})})


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def timestamps(doc: object) -> list[str]:
    """Every string in ``doc`` that looks like a date."""
    if isinstance(doc, dict):
        return [t for v in doc.values() for t in timestamps(v)]
    if isinstance(doc, list):
        return [t for v in doc for t in timestamps(v)]
    return [doc] if isinstance(doc, str) and re.match(r"^\d{4}-\d\d-\d\d", doc) else []


def test_user_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / ".loss.json").write_text("this is not a loss log")
    (tmp_path / "policy.toml").write_text("[arms.code]\nfloor = 2.0\n")
    cases = [
        ("history", "--run-dir", str(tmp_path / "missing")),
        ("status", "--run-dir", str(tmp_path / "typo")),
        ("history", "--run-dir", str(bad)),
        ("plot", "--run-dir", str(bad), "--out", str(tmp_path / "x.png")),
        ("plot", "--run-dir", str(tmp_path), "--out", str(tmp_path / "x.gif")),
        ("pivot", "--run-dir", str(tmp_path), "--policy", str(tmp_path / "policy.toml")),
        ("pivot", "--run-dir", str(tmp_path), "--policy", str(tmp_path / "nope.toml")),
        ("metrics", "export", "--run-dir", str(tmp_path), "--format", "xml", "--out", "x"),
        ("history",),
        # Bytes that are not UTF-8, as a shell passes them (M10): refused before any checkpoint.
        ("generate", "--run-dir", str(tmp_path), "--prompt", os.fsdecode(b"caf\xe9")),
    ]
    for argv in cases:
        res = run(*argv, env={"ANDREA_RUN_DIR": ""})
        assert res.returncode == 2, (argv, res.stderr)
        assert "Traceback" not in res.stderr and res.stdout == "", (argv, res.stderr)
        lines = res.stderr.strip().splitlines()
        # Ours: "andreactl: what is wrong" (its details indented below); argparse's: usage + error.
        assert lines[0].startswith("andreactl: ") or ": error: " in lines[-1], (argv, lines)
    # The last case's refusal names the argument, not the folder's missing checkpoint.
    assert "--prompt 1: not UTF-8 text (byte 3 of the argument)" in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "policy.toml"], "nothing created"


def test_status_of_a_stopped_run_is_immediate_and_creates_nothing(audited_run: Path) -> None:
    before = tree(audited_run)
    t0 = time.monotonic()
    res = run("status", "--run-dir", str(audited_run), "-o", "json")
    seconds = time.monotonic() - t0
    assert res.returncode == EXIT_STOPPED, res.stderr
    assert tree(audited_run) == before, "status created or changed something"
    assert seconds < 30, "a stopped run answers from its lock files, without retries"
    report = StatusReport.model_validate_json(res.stdout)
    assert report.state == "stopped" and report.trainer is None and report.proxy is None
    o = report.offline
    newest = max(int(p.name[5:11]) for p in audited_run.glob("step_*.json"))
    manifest = json.loads((audited_run / f"step_{newest:06d}.json").read_text())
    assert o.last_checkpoint.step == newest and o.last_checkpoint.trigger == manifest["trigger"]
    assert o.last_checkpoint.age_seconds >= 0
    raw = json.loads((audited_run / ".loss.json").read_text())
    assert (o.logged_step, o.segment, o.phase) == (raw[-1]["step"], raw[-1]["segment"], 1)
    ema = None
    canonical = {e["step"]: e for e in sorted(raw, key=lambda e: (e["step"], e["segment"]))}
    for step in sorted(canonical):
        x = canonical[step]["loss"]
        ema = x if ema is None else 0.9 * ema + 0.1 * x
    assert o.loss_ema == pytest.approx(ema, rel=1e-12)
    state = json.loads((audited_run / ".state.json").read_text())
    assert o.policy_fingerprint == state["bandit"]["policy_fingerprint"]
    # What the bandit saw when the proxy stopped: its reward and each arm's recent training loss.
    assert o.reward is not None and o.reward.model_dump(mode="json") == state["live_reward"]
    assert all(RFC3339.match(t) for t in timestamps(json.loads(res.stdout)))
    text = run("status", "--run-dir", str(audited_run))
    assert f"last checkpoint step {newest}" in text.stdout and "loss EMA" in text.stdout
    kind = state["live_reward"]["kind"]
    assert f"reward: {kind} (as the proxy last wrote .state.json): " in text.stdout
    for arm, standing in state["live_reward"]["arms"].items():
        row = next(line for line in text.stdout.splitlines() if line.startswith(f"{arm} "))
        assert row.split()[-1] == f"{standing['pulls']:,}"


def test_watch_explains_the_reward_once(tmp_path: Path) -> None:
    """Issue 33, A6: `watch` repeated the paragraph that explains the reward on every refresh."""
    from andrea.control.commands.status import status_report
    from andrea.daemon.mixing.policy import Policy
    from andrea.daemon.mixing.proxy import Proxy, ProxyOptions
    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.protocol import messages
    from tests.support.hostile import play_trainer, text_arms_config, trainer_hello

    audited_run = tmp_path  # a stopped run whose proxy wrote its reward in .state.json
    proxy = Proxy(
        ProxyOptions(tmp_path, text_arms_config(tmp_path), Policy(lag=2)), OperatorRequests()
    )
    proxy.setup()
    lock = play_trainer(tmp_path)
    assert isinstance(proxy.handle(b"t", trainer_hello(proxy.opts.cfg)), messages.Welcome)
    proxy.close()
    lock.close()
    offline = status_report(audited_run).offline
    meaning = offline.reward.meaning if offline and offline.reward else None
    assert meaning, "the audited run's proxy wrote its reward"
    cmd = [sys.executable, "-m", "andrea.control.andreactl", "watch", "--run-dir", str(audited_run),
           "--interval", "0.05"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines, refreshes = [], 0
    deadline = time.monotonic() + 120
    while refreshes < 4 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        refreshes += line.startswith("[")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    text = "".join(lines) + out
    assert refreshes >= 4 and proc.returncode == 0, text
    assert text.count(meaning) == 1, text
    assert text.count("reward: ") >= 3, text  # the table itself stays on every refresh read whole


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """What one fresh interpreter had imported after each of: building andreactl's parser, `status`
    of a stopped run (its exit code too), reading a run's events. Modules only accumulate, so a
    step without torch clears the steps before it as well (one interpreter for the three)."""
    run, events = tmp_path_factory.mktemp("status"), tmp_path_factory.mktemp("events")
    (events / "step_000010.json").write_text('{"trigger": "sigusr1"}')
    (events / ".loss.json").write_text("")
    code = f"""
import json, sys
from pathlib import Path
from andrea.control import andreactl
andreactl.build_parser()
parser = "torch" in sys.modules
code = andreactl.main(["--run-dir", {str(run)!r}, "status"])
status = [code, "torch" in sys.modules, "matplotlib" in sys.modules]
from andrea.control.run_events import read_run_events
from andrea.daemon.rundir.losslog import read_curve
d = Path({str(events)!r})
audit = read_run_events(d, read_curve(d / ".loss.json")).audit_checkpoints
print(json.dumps({{"parser": parser, "status": status, "events": [audit, "torch" in sys.modules]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_parser_is_torch_free_and_names_every_verification_problem(
    imported: dict[str, object],
) -> None:
    # Every andreactl call builds every subcommand's parser: torch there costs every command seconds.
    assert imported["parser"] is False, imported
    from andrea.control import verify_options
    from andrea.control.verify_resume import PROBLEMS

    assert tuple(PROBLEMS) == verify_options.PROBLEM_NAMES


def test_help_and_status_import_neither_torch_nor_matplotlib(imported: dict[str, object]) -> None:
    # The commands' modules are all imported to build the parser; the heavy imports of a few
    # commands (size, export, checkpoints: torch; plot: matplotlib) stay in those commands.
    assert imported["status"] == [3, False, False], imported
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "andrea.control.andreactl", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "usage: andreactl" in out.stdout
    imported_modules = {
        line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line
    }
    assert not imported_modules & {"torch", "matplotlib"}, (
        "andreactl --help imported torch or matplotlib"
    )


def test_reading_a_runs_events_is_torch_free(imported: dict[str, object]) -> None:
    # `andreactl plot`/`history` read each manifest's trigger: the manifest model imports torch,
    # which would cost a plot seconds for one string.
    assert imported["events"] == [[[10, "sigusr1"]], False], imported
