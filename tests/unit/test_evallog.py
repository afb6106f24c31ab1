"""`.eval.json`: the loss log's file discipline for evaluation records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from andrea.daemon.rundir.evallog import (
    ArmEval,
    EvalEntry,
    EvalLog,
    canonical_evals,
    last_eval,
    read_evals,
)
from andrea.daemon.rundir.losslog import LossLogCorrupt, LossLogLocked


def _entry(step: int, segment: int = 1, code: float = 2.5) -> EvalEntry:
    return EvalEntry(
        step=step,
        segment=segment,
        phase=0,
        arms={
            "code": ArmEval(loss=code, sequences=4, tokens=256),
            "docs": ArmEval(loss=3.25, sequences=4, tokens=256),
        },
        seconds=0.5,
        wall_time=1.7e9 + step,
    )


def test_append_reopen_and_read(tmp_path: Path) -> None:
    path = tmp_path / ".eval.json"
    with EvalLog.open(path) as log:
        assert log.append(_entry(100))
        assert log.append(_entry(200, code=math.nan))
        assert not log.append(_entry(200, code=1.0))  # (segment, step) already present
        with pytest.raises(LossLogLocked):
            EvalLog.open(path)
    doc = json.loads(path.read_text())  # plain JSON for any tool
    assert [d["step"] for d in doc] == [100, 200]
    assert doc[1]["arms"]["code"]["loss"] == "NaN"
    with EvalLog.open(path) as log:
        assert len(log) == 2 and (1, 200) in log
        log.append(_entry(200, segment=2, code=2.0))
    entries = read_evals(path)
    assert math.isnan(entries[1].arms["code"].loss)
    assert last_eval(path) == _entry(200, segment=2, code=2.0)
    canon = canonical_evals(entries)
    assert [(e.step, e.segment) for e in canon] == [(100, 1), (200, 2)]
    assert canon[0].mean_loss() == (2.5 + 3.25) / 2
    assert canon[0].worst() == ("docs", 3.25)


def test_torn_tail_at_every_byte_is_repaired(tmp_path: Path) -> None:
    path = tmp_path / ".eval.json"
    with EvalLog.open(path) as log:
        log.append(_entry(100))
    before = path.read_bytes()
    with EvalLog.open(path) as log:
        log.append(_entry(200))
    after = path.read_bytes()
    prefix = before[:-3]  # the old content without its terminator, which the append overwrote
    assert after.startswith(prefix)
    for cut in range(len(prefix), len(after)):
        path.write_bytes(after[:cut])
        with EvalLog.open(path) as log:
            assert len(log) in (1, 2)
        steps = [e.step for e in read_evals(path)]
        assert steps in ([100], [100, 200]), cut
        assert json.loads(path.read_text())[0]["step"] == 100


def test_a_loss_log_is_not_an_eval_log(tmp_path: Path) -> None:
    path = tmp_path / ".eval.json"
    line = (
        '{"step":1,"loss":2.0,"arm":"code","lr":0.001,"tokens":8,"wall_time":1.0,'
        '"segment":1,"phase":0,"batch_sha256":null}'
    )
    path.write_text(f"[\n{line}\n]\n")
    with pytest.raises(LossLogCorrupt, match="EvalEntry"):
        EvalLog.open(path)
    assert path.read_text() == f"[\n{line}\n]\n"  # untouched
