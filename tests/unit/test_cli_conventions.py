"""andreactl follows the conventions of systemctl and kubectl: each rule asserted.

Global options before or after the command, -o json, ANDREA_RUN_DIR, --version; one JSON schema
per command with RFC 3339 timestamps; --help with defaults, exit codes and an example; no traceback
for a user error; status creates nothing and answers a stopped run from its files."""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.control.reports import REPORTS, HistoryReport
from andrea.daemon.mixing import cli as proxy_cli
from andrea.daemon.trainer.service import cli as trainer_cli
from tests.support.reports import RFC3339


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


def test_every_command_has_a_schema(capsys) -> None:
    assert andreactl.main(["schema"]) == 0
    schemas = json.loads(capsys.readouterr().out)
    assert set(schemas) == set(REPORTS)
    names = {c.name for c in andreactl.COMMANDS}
    assert set(REPORTS) | {"export", "verify-resume", "schema"} == names
    status = schemas["status"]["$defs"]["StatusReport"]
    assert status["properties"]["time"]["format"] == "date-time"


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


@pytest.mark.parametrize(
    "parser",
    [trainer_cli.build_parser, proxy_cli.build_parser],
    ids=["andrea-trainer", "andrea-proxy"],
)
def test_an_empty_run_directory_is_refused_not_taken_as_the_current_one(
    parser: Callable[[], argparse.ArgumentParser], capsys
) -> None:
    # `--run-dir "$RUN"` with RUN unset: Path("") is ".", which became the run directory.
    with pytest.raises(SystemExit) as exit:
        parser().parse_args(["--run-dir", ""])
    assert exit.value.code == 2
    assert "--run-dir: an empty run directory; name one" in capsys.readouterr().err


#: A run directory whose path holds a byte that is not UTF-8 (as the file system may).
NOT_UTF8 = os.fsdecode(b"/tmp/run-\xff")
NOT_UTF8_LINE = "the path is not UTF-8 (byte 0xff)"


@pytest.mark.parametrize(
    "parser",
    [trainer_cli.build_parser, proxy_cli.build_parser],
    ids=["andrea-trainer", "andrea-proxy"],
)
def test_a_run_directory_that_is_not_utf8_is_a_usage_error(
    parser: Callable[[], argparse.ArgumentParser],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 50, M7: the trainer failed with CRITICAL UnicodeEncodeError writing .socket-dir (exit
    1, restarted by systemd until its start limit)."""
    with pytest.raises(SystemExit) as exit:
        parser().parse_args(["--run-dir", NOT_UTF8])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "/tmp/run-\\xff: " + NOT_UTF8_LINE in err and "Traceback" not in err
    monkeypatch.setenv("ANDREA_RUN_DIR", NOT_UTF8)
    with pytest.raises(SystemExit) as exit:
        parser().parse_args([])
    assert exit.value.code == 2 and NOT_UTF8_LINE in capsys.readouterr().err


def test_andreactl_refuses_a_run_directory_that_is_not_utf8(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert andreactl.main(["--run-dir", NOT_UTF8, "status"]) == 2
    assert NOT_UTF8_LINE in capsys.readouterr().err
    monkeypatch.setenv("ANDREA_RUN_DIR", NOT_UTF8)
    assert andreactl.main(["status"]) == 2
    assert NOT_UTF8_LINE in capsys.readouterr().err


def test_andreactl_refuses_an_empty_run_directory_and_an_empty_list_of_steps(
    tmp_path: Path, capsys
) -> None:
    assert andreactl.main(["--run-dir", "", "status"]) == 2
    assert "an empty run directory" in capsys.readouterr().err
    # An empty --steps named all older checkpoints: it names none, a usage error.
    assert andreactl.main(["--run-dir", str(tmp_path), "prune", "--steps", "", "--dry-run"]) == 2
    assert "--steps takes step numbers" in capsys.readouterr().err
