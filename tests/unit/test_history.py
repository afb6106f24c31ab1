"""`andreactl history` of a run's files, in this process: the canonical curve with each step's
arm's loss EMA, `--arm NAME` (one arm's steps, the EMA over them), and an arm the log does not
hold refused with exit 2, naming the arms it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.control.commands.conventions import EXIT_USAGE
from andrea.control.reports import ErrorReport, HistoryReport
from andrea.daemon.rundir.losslog import LossLog
from andrea.protocol.lossentry import LossEntry

ARMS = ["code", "prose", "code", "code", "prose", "docs", "code", "prose"]


def loss_of(step: int, segment: int) -> float:
    return 4.0 - step / 10 - segment / 100


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Steps 1-8 of the first trainer life, and 6-8 trained again by the second (canonical)."""
    with LossLog.open(tmp_path / ".loss.json") as log:
        for segment, steps in ((1, range(1, 9)), (2, range(6, 9))):
            for s in steps:
                log.append(LossEntry(step=s, loss=loss_of(s, segment), arm=ARMS[s - 1], lr=1e-3,
                                     tokens=64, wall_time=1.75e9 + 10 * segment + s,
                                     segment=segment, phase=0, batch_sha256=None))  # fmt: skip
    return tmp_path


def canonical(step: int) -> float:
    return loss_of(step, 2 if step >= 6 else 1)


def arm_ema(arm: str) -> list[tuple[int, float]]:
    """By hand: (step, the arm's loss EMA after it) over the canonical steps of ``arm``."""
    ema, out = None, []
    for s, a in enumerate(ARMS, 1):
        if a == arm:
            ema = canonical(s) if ema is None else 0.9 * ema + 0.1 * canonical(s)
            out.append((s, ema))
    return out


def history(capsys: pytest.CaptureFixture[str], run: Path, *argv: str) -> tuple[int, str, str]:
    code = andreactl.main(["--run-dir", str(run), "history", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_each_row_carries_its_arms_loss_ema(run: Path, capsys) -> None:
    code, out, _ = history(capsys, run, "--json", "--last", "0")
    assert code == 0
    report = HistoryReport.model_validate_json(out)
    assert report.arm is None and [row.step for row in report.rows] == list(range(1, 9))
    emas = {s: ema for arm in set(ARMS) for s, ema in arm_ema(arm)}
    for row in report.rows:
        assert row.loss == pytest.approx(canonical(row.step))
        assert row.arm_loss_ema == pytest.approx(emas[row.step], rel=1e-12)


def test_one_arms_steps_and_its_ema(run: Path, capsys) -> None:
    code, out, _ = history(capsys, run, "--json", "--arm", "code", "--last", "0")
    assert code == 0
    report = HistoryReport.model_validate_json(out)
    assert report.arm == "code" and {row.arm for row in report.rows} == {"code"}
    got = [(row.step, row.arm_loss_ema) for row in report.rows]
    assert got == [(s, pytest.approx(ema, rel=1e-12)) for s, ema in arm_ema("code")]
    assert [row.segment for row in report.rows] == [1, 1, 1, 2]

    # --last counts the arm's steps; the EMA is the full history's, not restarted at the cut.
    code, text, _ = history(capsys, run, "--arm", "code", "--last", "2")
    lines = text.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["step", "loss", "arm", "EMA"]
    rows = [line.split() for line in lines[1:3]]
    assert [int(r[0]) for r in rows] == [4, 7]
    assert [float(r[2]) for r in rows] == pytest.approx(
        [e for _, e in arm_ema("code")[-2:]], abs=1e-4
    )
    assert lines[3] == "arm code: 4 of the 8 logged steps"


def test_an_arm_the_log_does_not_hold_is_a_usage_error(run: Path, capsys) -> None:
    code, out, err = history(capsys, run, "--arm", "cod")
    assert code == EXIT_USAGE and out == ""
    assert err.strip() == (
        "andreactl: --arm cod: no step of .loss.json was trained on it; the arms there: "
        "code, docs, prose (did you mean 'code'?)"
    )
    code, out, err = history(capsys, run, "--json", "--arm", "comments")
    report = ErrorReport.model_validate_json(out)
    assert code == EXIT_USAGE and report.exit_code == EXIT_USAGE and report.command == "history"
    assert report.error.endswith("the arms there: code, docs, prose")
    # The held-out evaluations are of every arm: --arm does not go with --eval.
    code, out, err = history(capsys, run, "--eval", "--arm", "code")
    assert code == EXIT_USAGE and "not allowed with argument" in err


def test_a_negative_count_of_steps_is_a_usage_error(run: Path, capsys) -> None:
    # `--last -3` was taken as Python's slice [-(-3):], which drops the first three steps.
    code, out, err = history(capsys, run, "--last", "-3")
    assert code == EXIT_USAGE and out == ""
    assert "--last: '-3' is not a count (0 or more)" in err


def test_the_schema_names_the_arm_and_its_ema(capsys) -> None:
    assert andreactl.main(["schema", "history"]) == 0
    schema = json.loads(capsys.readouterr().out)
    report = schema["$defs"]["HistoryReport"]["properties"]
    assert "arm" in report and "arm_loss_ema" in schema["$defs"]["HistoryRow"]["properties"]
