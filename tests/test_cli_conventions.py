"""andreactl follows the conventions of systemctl and kubectl: each rule asserted.

Global options before or after the command, -o json, ANDREA_RUN_DIR, --version; one JSON schema
per command with RFC 3339 timestamps; --help with defaults, exit codes and an example; no traceback
for a user error; status creates nothing and answers a stopped run from its files."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.control.reports import REPORTS, HistoryReport, StatusReport
from andrea.daemon.mixing import cli as proxy_cli
from andrea.daemon.trainer.service import cli as trainer_cli

from .support.reports import RFC3339


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "andrea.control.andreactl", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def timestamps(doc: object) -> list[str]:
    """Every string in ``doc`` that looks like a date."""
    if isinstance(doc, dict):
        return [t for v in doc.values() for t in timestamps(v)]
    if isinstance(doc, list):
        return [t for v in doc for t in timestamps(v)]
    return [doc] if isinstance(doc, str) and re.match(r"^\d{4}-\d\d-\d\d", doc) else []


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    top = andreactl.build_parser()
    (sub,) = [a for a in top._actions if isinstance(a, argparse._SubParsersAction)]
    return [("andreactl", top), *sub.choices.items()]


def test_every_option_has_help_and_every_command_exit_codes_and_an_example() -> None:
    parsers = all_parsers() + [
        ("andrea-trainer", trainer_cli.build_parser()),
        ("andrea-proxy", proxy_cli.build_parser()),
    ]
    for name, parser in parsers:
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                assert action.help, f"{name} {action.option_strings} has no help"
    for name, parser in all_parsers():
        text = parser.format_help()
        assert "exit codes:" in text and "  2  usage error" in text, name
        assert re.search(r"examples:\n  andreactl ", text), name
        assert "--run-dir" in text and "-o {text,json}" in text, name
    watch = dict(all_parsers())["watch"].format_help()
    assert "(default: 2.0)" in watch
    assert "(default: INFO)" in trainer_cli.build_parser().format_help()


def test_version_and_global_options_after_the_command(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        andreactl.main(["--version"])
    assert done.value.code == 0 and re.match(r"andreactl \d+\.\d+", capsys.readouterr().out)

    from andrea.daemon.rundir.losslog import LossLog
    from andrea.protocol.lossentry import LossEntry

    with LossLog.open(tmp_path / ".loss.json") as log:
        for s in range(1, 6):
            log.append(LossEntry(step=s, loss=3.0 - s / 10, arm="code", lr=1e-3, tokens=64,
                                 wall_time=1.75e9 + s, segment=1, phase=0, batch_sha256=None))  # fmt: skip
    outputs = []
    for argv, env in (
        (["--run-dir", str(tmp_path), "--json", "history"], {}),
        (["history", "--run-dir", str(tmp_path), "--json"], {}),
        (["history", "-o", "json", "--run-dir", str(tmp_path)], {}),
        (["history", "-o", "json"], {"ANDREA_RUN_DIR": str(tmp_path)}),
    ):
        os.environ.pop("ANDREA_RUN_DIR", None)
        os.environ.update(env)
        try:
            assert andreactl.main(argv) == 0
        finally:
            os.environ.pop("ANDREA_RUN_DIR", None)
        outputs.append(capsys.readouterr().out)
    assert len(set(outputs)) == 1
    report = HistoryReport.model_validate_json(outputs[0])
    assert [row.step for row in report.rows] == [1, 2, 3, 4, 5]
    assert all(RFC3339.match(t) for t in timestamps(json.loads(outputs[0])))
    assert json.loads(outputs[0])["rows"][0]["time"] == "2025-06-15T15:06:41Z"


@pytest.mark.process
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
    ]
    for argv in cases:
        res = run(*argv, env={"ANDREA_RUN_DIR": ""})
        assert res.returncode == 2, (argv, res.stderr)
        assert "Traceback" not in res.stderr and res.stdout == "", (argv, res.stderr)
        lines = res.stderr.strip().splitlines()
        # Ours: "andreactl: what is wrong" (its details indented below); argparse's: usage + error.
        assert lines[0].startswith("andreactl: ") or ": error: " in lines[-1], (argv, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "policy.toml"], "nothing created"


def test_every_command_has_a_schema(capsys) -> None:
    assert andreactl.main(["schema"]) == 0
    schemas = json.loads(capsys.readouterr().out)
    assert set(schemas) == set(REPORTS)
    names = {c.name for c in andreactl.COMMANDS}
    assert set(REPORTS) | {"export", "verify-resume", "schema"} == names
    status = schemas["status"]["$defs"]["StatusReport"]
    assert status["properties"]["time"]["format"] == "date-time"


@pytest.mark.process
def test_status_of_a_stopped_run_is_immediate_and_creates_nothing(audited_run: Path) -> None:
    before = tree(audited_run)
    t0 = time.monotonic()
    res = run("status", "--run-dir", str(audited_run), "-o", "json")
    seconds = time.monotonic() - t0
    assert res.returncode == 3, res.stderr
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


def test_the_parser_is_torch_free_and_names_every_verification_problem() -> None:
    # Every andreactl call builds every subcommand's parser: torch there costs every command seconds.
    code = (
        "import sys; from andrea.control import andreactl; andreactl.build_parser();"
        " print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
    from andrea.control import verify_options
    from andrea.control.verify_resume import PROBLEMS

    assert tuple(PROBLEMS) == verify_options.PROBLEM_NAMES


def test_help_and_status_import_neither_torch_nor_matplotlib(tmp_path: Path) -> None:
    # The commands' modules are all imported to build the parser; the heavy imports of a few
    # commands (size, export, checkpoints: torch; plot: matplotlib) stay in those commands.
    code = (
        "import sys; from andrea.control import andreactl;"
        f" code = andreactl.main(['--run-dir', {str(tmp_path)!r}, 'status']);"
        " print(code, 'torch' in sys.modules, 'matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "3 False False", out.stdout + out.stderr
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "andrea.control.andreactl", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "usage: andreactl" in out.stdout
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "matplotlib"}, "andreactl --help imported torch or matplotlib"


def test_reading_a_runs_events_is_torch_free(tmp_path: Path) -> None:
    # `andreactl plot`/`history` read each manifest's trigger: the manifest model imports torch,
    # which would cost a plot seconds for one string.
    (tmp_path / "step_000010.json").write_text('{"trigger": "sigusr1"}')
    code = (
        "import sys; from pathlib import Path; from andrea.control.run_events import"
        " read_run_events; from andrea.daemon.rundir.losslog import read_curve;"
        f" d = Path({str(tmp_path)!r});"
        " (d / '.loss.json').write_text('');"
        " print(read_run_events(d, read_curve(d / '.loss.json')).audit_checkpoints,"
        " 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[(10, 'sigusr1')] False", out.stderr


def _code(argv: list[str]) -> int:
    """andreactl's exit code for ``argv``, in-process (argparse's own exits included)."""
    try:
        return andreactl.main(argv)
    except SystemExit as done:
        return int(done.code or 0)


def _one_log(run_dir: Path) -> None:
    from andrea.daemon.rundir.losslog import LossLog
    from andrea.protocol.lossentry import LossEntry

    with LossLog.open(run_dir / ".loss.json") as log:
        for s in range(1, 4):
            log.append(LossEntry(step=s, loss=3.0, arm="code", lr=1e-3, tokens=64,
                                 wall_time=1.75e9 + s, segment=1, phase=0, batch_sha256=None))  # fmt: skip


def test_no_abbreviated_flag_and_a_suggestion_for_a_misspelled_command(
    tmp_path: Path, capsys
) -> None:
    """Issue 24, item 20: `history --la 2` was taken as --last; a misspelled command got a bare
    list of choices. Every parser of the project takes an option only as it is spelled."""
    _one_log(tmp_path)
    assert _code(["history", "--run-dir", str(tmp_path), "--la", "2"]) == 2
    assert "unrecognized arguments: --la 2" in capsys.readouterr().err
    assert _code(["stauts", "--run-dir", str(tmp_path)]) == 2
    assert "did you mean 'status'?" in capsys.readouterr().err
    from andrea.control.export import bundle as export
    from andrea.control.verify_resume import main as verify_main

    for name, parser in [
        *all_parsers(),
        ("andrea-trainer", trainer_cli.build_parser()),
        ("andrea-proxy", proxy_cli.build_parser()),
    ]:
        assert parser.allow_abbrev is False, name
    for main, needed in ((export.main, []), (verify_main, ["--output", str(tmp_path / "o")])):
        with pytest.raises(SystemExit):
            main([*needed, "--run", str(tmp_path)])
        assert "unrecognized arguments: --run" in capsys.readouterr().err


def test_the_top_level_help_lists_every_exit_code() -> None:
    """Issue 24, item 19: `status` exits 3 on a stopped run; the top-level help said nothing of 3."""
    text = andreactl.build_parser().format_help()
    assert re.search(r"^  3  status: the run is stopped", text, re.M), text


def test_the_environments_run_dir_never_breaks_a_command_without_use_for_it(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Issue 24, item 13: with ANDREA_RUN_DIR set, verify-resume --problem mini was refused
    ('--config and --run-dir apply to the trainer problem only')."""
    monkeypatch.setenv("ANDREA_RUN_DIR", str(tmp_path))
    taken = tmp_path / "proof"
    taken.mkdir()  # an existing output: the verifier refuses it at once, before any work
    assert _code(["verify-resume", "--problem", "mini", "--output", str(taken)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "trainer problem only" not in err


def test_every_json_error_is_a_json_document_with_the_exit_code(tmp_path: Path, capsys) -> None:
    """Issue 24, item 17: with --json a script reads one document on stdout whatever happens; and
    `stop` on a stopped run is done, as with systemctl (exit 0)."""
    from andrea.control.reports import ErrorReport, RequestReport

    cases = [
        (["--json", "history", "--run-dir", str(tmp_path / "missing")], 2, "history"),
        (["--json", "checkpoint", "--run-dir", str(tmp_path)], 1, "checkpoint"),
        (["--json", "samples", "--run-dir", str(tmp_path)], 1, "samples"),
        (["-o", "json", "stauts", "--run-dir", str(tmp_path)], 2, "stauts"),
        (["--json", "history", "--run-dir", str(tmp_path), "--la", "2"], 2, "history"),
        (["--json", "plot", "--run-dir", str(tmp_path), "--out", "x.gif"], 2, "plot"),
        (["--json", "export", "--run-dir", str(tmp_path), "--to", str(tmp_path / "e")], 2, "export"),
        (["--json", "verify-resume", "--problem", "mini", "--output", str(tmp_path)], 2, "verify-resume"),
    ]  # fmt: skip
    for argv, code, command in cases:
        assert _code(argv) == code, argv
        doc = ErrorReport.model_validate_json(capsys.readouterr().out)
        assert doc.exit_code == code and doc.error, argv
        assert doc.command == (command if command != "stauts" else None), argv
    # A directory that holds no run is not "a stopped run" (issue 33, B15: /etc said "nothing to
    # stop", exit 0).
    for empty in (tmp_path, Path("/etc")):
        assert _code(["--json", "stop", "--run-dir", str(empty)]) == 2
        doc = ErrorReport.model_validate_json(capsys.readouterr().out)
        assert "is not a run directory" in doc.error and doc.exit_code == 2
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "run.toml").write_text('preset = "andrea-tiny"\n')
    assert _code(["--json", "stop", "--run-dir", str(tmp_path)]) == 0
    stopped = RequestReport.model_validate_json(capsys.readouterr().out)
    assert stopped.ok and stopped.detail == {"already_stopped": True}
    assert _code(["stop", "--run-dir", str(tmp_path), "--wait"]) == 0
    assert "not running; nothing to stop" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["run.toml"], (
        "asking a stopped run creates nothing"
    )


def test_metrics_export_never_writes_through_a_link(tmp_path: Path, capsys) -> None:
    """Issue 24, item 12: --out on a dangling link created the file it points at."""
    _one_log(tmp_path)
    target = tmp_path / "elsewhere" / "metrics.csv"
    target.parent.mkdir()
    for fmt in ("csv", "jsonl", "tensorboard"):
        link = tmp_path / f"out-{fmt}"
        link.symlink_to(target)
        argv = [
            "metrics",
            "export",
            "--run-dir",
            str(tmp_path),
            "--format",
            fmt,
            "--out",
            str(link),
        ]
        assert _code(argv) == 2, fmt
        assert "symbolic link" in capsys.readouterr().err
        assert not target.exists() and os.readlink(link) == str(target)


@pytest.mark.process
def test_watch_explains_the_reward_once(tmp_path: Path) -> None:
    """Issue 33, A6: `watch` repeated the paragraph that explains the reward on every refresh."""
    from andrea.control.commands.status import status_report
    from andrea.daemon.mixing.policy import Policy
    from andrea.daemon.mixing.proxy import Proxy, ProxyOptions
    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.protocol import messages

    from .support.hostile import play_trainer, text_arms_config, trainer_hello

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
