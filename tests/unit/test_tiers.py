"""The folder decides the tier (tests/conftest.py): run in-process by pytester against a small tree
with the real conftest's rules, so that removing a rule fails here."""

from __future__ import annotations

import pytest

from tests import conftest as rules

PASSING = "def test_one():\n    assert True\n"


def tree(pytester: pytest.Pytester, files: dict[str, str]) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    process: starts real processes\n")
    for path, text in files.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_inprocess(
        "-p", "no:randomly", "-p", "no:xdist", *args, plugins=[rules]
    )


def test_a_test_file_outside_the_two_folders_is_refused(pytester: pytest.Pytester) -> None:
    tree(pytester, {"tests/unit/test_u.py": PASSING, "tests/test_stray.py": PASSING})
    result = run(pytester, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*tests/test_stray.py::test_one: a test outside tests/unit/ and tests/process/*"]
    )


def test_a_process_mark_under_unit_is_refused(pytester: pytest.Pytester) -> None:
    marked = "import pytest\n\n@pytest.mark.process\ndef test_marked():\n    pass\n"
    tree(pytester, {"tests/unit/test_u.py": PASSING + "\n\n" + marked})
    result = run(pytester, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*tests/unit/test_u.py::test_marked: marked `process` in tests/unit/*"]
    )


def test_not_process_selects_exactly_the_unit_folder(pytester: pytest.Pytester) -> None:
    tree(
        pytester,
        {
            "tests/unit/test_u.py": PASSING + "\ndef test_two():\n    pass\n",
            "tests/process/test_p.py": PASSING + "\ndef test_three():\n    pass\n",
        },
    )
    unit = run(pytester, "--collect-only", "-q", "-m", "not process")
    assert unit.ret == pytest.ExitCode.OK
    selected = sorted(line for line in unit.outlines if "::" in line)
    assert selected == ["tests/unit/test_u.py::test_one", "tests/unit/test_u.py::test_two"]
    process = run(pytester, "--collect-only", "-q", "-m", "process")
    assert sorted(line for line in process.outlines if "::" in line) == [
        "tests/process/test_p.py::test_one",
        "tests/process/test_p.py::test_three",
    ]
