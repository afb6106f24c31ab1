"""Every --json document of andreactl is in the schema registry, and real output validates against
the schema `andreactl schema COMMAND` prints for it: against a prepared run directory in-process,
and against live daemons (pivot, its cancel, checkpoint, stop, watch) in a process test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.control.reports import REPORTS, report_models
from andrea.daemon.rundir.evallog import ArmEval, EvalEntry, EvalLog
from andrea.daemon.rundir.losslog import LossLog
from andrea.protocol.lossentry import LossEntry
from tests.support.reports import check, printed_schema, variants

#: Seconds to wait for a daemon's log line: generous, for a loaded 2-core machine.


def test_the_registry_names_every_command_and_the_schema_prints_it(capsys) -> None:
    names = {c.name for c in andreactl.COMMANDS}
    assert set(REPORTS) == names - {"schema"}, "a command whose --json document has no schema"
    for command in REPORTS:
        models = report_models(command)
        assert set(variants(printed_schema(command, capsys))) == {
            model.__name__ for model in models
        }
    assert {c: len(models) for c, models in REPORTS.items() if len(models) > 1} == {
        "history": 2,
        "pivot": 2,
        "tokenizer": 3,
    }


@pytest.fixture
def prepared_run(tmp_path: Path) -> Path:
    """A stopped run's files: two segments of a two-arm loss curve, evaluations, samples."""
    run = tmp_path / "run"
    run.mkdir()
    with LossLog.open(run / ".loss.json") as log:
        for s in range(1, 31):
            log.append(LossEntry(step=s, loss=3.0 - s / 50, arm=("code", "prose")[s % 2], lr=1e-3,
                                 tokens=64, wall_time=1.75e9 + s, segment=1 + (s > 20), phase=0,
                                 batch_sha256=None))  # fmt: skip
    with EvalLog.open(run / ".eval.json") as log:
        for s in (10, 20, 30):
            arms = {
                a: ArmEval(loss=2.5 + s / 100, sequences=4, tokens=256) for a in ("code", "prose")
            }
            log.append(EvalEntry(step=s, segment=1 + (s > 20), phase=0, arms=arms, seconds=0.5,
                                 wall_time=1.75e9 + s))  # fmt: skip
    record = {"step": 30, "segment": 2, "phase": 0, "received_utc": "2025-06-15T15:07:10.000+00:00",
              "arm_mix": {"code": 5, "prose": 5}, "samples": [{"prompt": "def", "text": " f():"}]}  # fmt: skip
    (run / ".samples.json").write_text(
        json.dumps({"format": "andrea-samples/1", "kept": 4, "records": [record]})
    )
    return run


def test_every_report_of_a_stopped_run_validates(
    prepared_run: Path, tmp_path: Path, capsys
) -> None:
    run = ["--run-dir", str(prepared_run), "--json"]
    cases = [
        (["status"], 3, "StatusReport"),
        (["history", "--last", "0"], 0, "HistoryReport"),
        (["history", "--arm", "prose"], 0, "HistoryReport"),
        (["history", "--eval"], 0, "EvalHistoryReport"),
        (["samples"], 0, "SamplesReport"),
        (["checkpoints", "--quick"], 0, "CheckpointsReport"),
        (["prune", "--dry-run"], 0, "PruneReport"),
        (["plot", "--out", str(tmp_path / "run.svg")], 0, "PlotReport"),
        (["metrics", "export", "--format", "csv", "--out", str(tmp_path / "m.csv")], 0, "MetricsReport"),
        (["size", "--preset", "andrea-tiny"], 0, "SizeReport"),
        (["plan", "--preset", "andrea-tiny", "--gpus", "2"], 0, "PlanReport"),
    ]  # fmt: skip
    for argv, code, model in cases:
        assert andreactl.main([*run, *argv]) == code, argv
        out = capsys.readouterr().out
        assert check(argv[0], out, capsys) == model, argv
    assert andreactl.main([*run, "history", "--eval"]) == 0
    assert [row["step"] for row in json.loads(capsys.readouterr().out)["rows"]] == [10, 20, 30]
