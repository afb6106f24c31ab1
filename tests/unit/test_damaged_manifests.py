"""What the read-only tools make of manifests a person or a crash damaged: `andreactl checkpoints`,
`prune`, `status` of a stopped run and the audit plot show what is there and never fail on it.

A damaged manifest fails its content hash, so none of its fields can be trusted: a time without a
zone or a number for a time, a list for a trigger, JSON nested past Python's recursion limit, a name
the trainer would not write, a payload that is gone or cut.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea.control.offline import offline_summary
from andrea.control.run_events import read_run_events
from andrea.daemon.checkpoint import catalog
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.boundedio import parse_json, read_json
from andrea.daemon.rundir.losslog import LossLog, read_columns
from andrea.protocol.lossentry import LossEntry
from tests.support.hostile import write_checkpoint

NESTED = "[" * 200_000 + "]" * 200_000


@pytest.fixture
def run(tmp_path: Path) -> Path:
    for step in (10, 20, 30):
        write_checkpoint(tmp_path, step)
    with LossLog.open(tmp_path / rundir.LOSS_FILE) as log:
        for s in range(1, 31):
            log.append(LossEntry(step=s, loss=3.0, arm="code", lr=1e-3, tokens=64,
                                 wall_time=1.75e9 + s, segment=1, phase=0, batch_sha256=None))  # fmt: skip
    return tmp_path


def edit(run: Path, step: int, key: str, value: object) -> None:
    path = run / rundir.manifest_name(step)
    man = json.loads(path.read_text())
    man[key] = value
    path.write_text(json.dumps(man))


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("step_000030.json", (30, "json")),
        ("step_1234567.bin", (1234567, "bin")),
        ("step_0000030.json", None),  # padded past six digits: not a name the trainer writes
        ("step_01234567.bin", None),
        ("step_000030.json.123.tmp", None),
    ],
)
def test_only_names_the_trainer_writes_are_checkpoints(name: str, parsed: object) -> None:
    assert rundir.parse_checkpoint_name(name) == parsed


def test_json_nested_too_deeply_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(NESTED)
    with pytest.raises(ValueError, match="nested too deeply"):
        read_json(path, 1 << 20)
    assert parse_json(b'{"a": [1]}', path) == {"a": [1]}


@pytest.mark.parametrize(
    "created", ["2026-12-06T01:47:4x", "2026-12-06T01:47:47", 5, None, ["2026-12-06T01:47:47Z"]]
)
def test_a_damaged_time_is_shown_as_unknown(run: Path, created: object) -> None:
    edit(run, 20, "created_utc", created)
    entries = {e.step: e for e in catalog.inventory(run)}
    assert entries[20].created_utc is None and entries[20].age_seconds(catalog.now_utc()) is None
    assert entries[20].state.startswith("damaged")
    assert entries[30].intact and entries[30].age_seconds(catalog.now_utc()) is not None


def test_a_manifest_nested_too_deeply_is_damaged_not_fatal(run: Path) -> None:
    (run / rundir.manifest_name(30)).write_text(NESTED)
    entries = {e.step: e for e in catalog.inventory(run, verify=False)}
    assert "nested too deeply" in entries[30].state and entries[20].intact
    summary = offline_summary(run)
    assert summary.last_checkpoint is not None and summary.last_checkpoint.step == 20
    events = read_run_events(run, read_columns(run / rundir.LOSS_FILE))
    assert any("step_000030.json" in p and "nested too deeply" in p for p in events.problems)


def test_a_trigger_that_is_not_a_name_is_shown_not_trusted(run: Path) -> None:
    edit(run, 10, "trigger", ["sigusr1"])
    events = read_run_events(run, read_columns(run / rundir.LOSS_FILE))
    assert events.audit_checkpoints == []
    entries = {e.step: e for e in catalog.inventory(run)}
    assert entries[10].trigger == "['sigusr1']" and not entries[10].intact


@pytest.mark.parametrize("damage", ["empty", "missing", "misnamed"])
def test_status_of_a_stopped_run_names_the_checkpoint_a_restart_would_resume(
    run: Path, damage: str
) -> None:
    newest = run / rundir.bin_name(30)
    if damage == "empty":
        newest.write_bytes(b"")
    elif damage == "missing":
        newest.unlink()
    else:  # a copy under a name the trainer would not write is not a newer checkpoint
        (run / "step_0000040.json").write_bytes((run / rundir.manifest_name(30)).read_bytes())
        (run / "step_0000040.bin").write_bytes(newest.read_bytes())
    summary = offline_summary(run)
    expected = 30 if damage == "misnamed" else 20
    assert summary.last_checkpoint is not None and summary.last_checkpoint.step == expected


def test_keep_latest_counts_the_checkpoints_a_run_can_resume_from(run: Path) -> None:
    write_checkpoint(run, 35)
    write_checkpoint(run, 45)
    for step in (35, 45):  # the two newest damaged: they are evidence, and no resume point
        (run / rundir.bin_name(step)).write_bytes(b"cut")
    plan = catalog.plan_prune(catalog.inventory(run, verify=False), keep_latest=2)
    assert [e.step for e in plan.remove] == [10]
    assert plan.keep == {
        45: "damaged (left for inspection)",
        35: "damaged (left for inspection)",
        30: "among the newest 2 intact",
        20: "among the newest 2 intact",
    }
