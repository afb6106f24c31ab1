"""The order in which -n hands out test files (tests/support/scheduling.py): longest first by the
recorded seconds, unknown process files first and unknown unit files last, and the recording
merged into what a run of other files left."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.support.scheduling import FileSeconds, load_seconds, longest_first


def items(*nodeids: str) -> list:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def ids(ordered: list) -> list[str]:
    return [i.nodeid for i in ordered]


def test_files_go_longest_first_and_each_keeps_its_tests_in_order() -> None:
    collected = items(
        "tests/process/test_a.py::one",
        "tests/process/test_a.py::two",
        "tests/process/test_b.py::one",
        "tests/unit/test_c.py::one",
        "tests/unit/test_c.py::two[x]",
    )
    seconds = {"tests/process/test_a.py": 3.0, "tests/process/test_b.py": 30.0}
    seconds["tests/unit/test_c.py"] = 4.0
    assert ids(longest_first(collected, seconds)) == [
        "tests/process/test_b.py::one",
        "tests/unit/test_c.py::one",
        "tests/unit/test_c.py::two[x]",
        "tests/process/test_a.py::one",
        "tests/process/test_a.py::two",
    ]


def test_an_unknown_process_file_goes_first_and_an_unknown_unit_file_last() -> None:
    collected = items(
        "tests/unit/test_new.py::one",
        "tests/process/test_known.py::one",
        "tests/unit/test_known.py::one",
        "tests/process/test_new.py::one",
    )
    seconds = {"tests/process/test_known.py": 60.0, "tests/unit/test_known.py": 0.5}
    assert ids(longest_first(collected, seconds)) == [
        "tests/process/test_new.py::one",
        "tests/process/test_known.py::one",
        "tests/unit/test_known.py::one",
        "tests/unit/test_new.py::one",
    ]


def test_without_figures_the_process_files_come_first_in_collection_order() -> None:
    collected = items("tests/unit/u.py::t", "tests/process/p.py::t", "tests/process/q.py::t")
    assert ids(longest_first(collected, {})) == [
        "tests/process/p.py::t",
        "tests/process/q.py::t",
        "tests/unit/u.py::t",
    ]


def test_a_missing_or_damaged_record_is_no_figures(tmp_path: Path) -> None:
    assert load_seconds(tmp_path / "none.json") == {}
    for text in ("{not json", "[1, 2]", '{"tests/unit/a.py": "long"}'):
        (tmp_path / "f.json").write_text(text)
        assert load_seconds(tmp_path / "f.json") == {}


def test_a_recording_updates_its_files_and_drops_those_that_are_gone(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / "tests" / "unit").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / "unit" / f"test_{name}.py").write_text("")
    record = tmp_path / "seconds.json"
    record.write_text(
        json.dumps({"tests/unit/test_a.py": 9.0, "tests/unit/test_b.py": 2.0, "tests/gone.py": 1})
    )
    recorder = FileSeconds(record)
    for phase in (0.25, 1.0, 0.04):  # setup, call, teardown of one test of test_a.py
        recorder.pytest_runtest_logreport(
            SimpleNamespace(nodeid="tests/unit/test_a.py::t", duration=phase)
        )
    session = SimpleNamespace(config=SimpleNamespace(rootpath=tmp_path))
    recorder.pytest_sessionfinish(session, 0)
    assert json.loads(record.read_text()) == {
        "tests/unit/test_a.py": 1.3,
        "tests/unit/test_b.py": 2.0,
    }
