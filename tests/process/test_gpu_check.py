"""scripts/gpu_check.py's plumbing that runs children (tests/unit/test_gpu_check.py has the rest):
a section's budget bounds what is left, a failed child leaves its last 40 lines in the report, and
children run without the systemd variables that would send their logs to the journal."""

from __future__ import annotations

import sys

from tests.support.scripts import load_script, make_check, report

gpu_check = load_script("gpu_check")


def test_a_section_budget_bounds_what_is_left(tmp_path) -> None:
    check = make_check(tmp_path)
    check.section("Install", 10)
    assert check.left() <= 10
    r = check.run([sys.executable, "-c", "pass"], limit=100)
    assert r.ok
    check.section("Spent", 3)
    r = check.run([sys.executable, "-c", "pass"], limit=100)
    assert r.timed_out and "budget is spent" in r.log


def test_a_failed_child_leaves_its_last_40_lines_in_the_report(tmp_path) -> None:
    check = make_check(tmp_path)
    r = check.run([sys.executable, "-c", "[print(f'line {i}') for i in range(100)]; exit(3)"], 60)
    assert not check.expect("child", r)
    text = report(check)
    assert "exit 3" in text and "**FAIL**" in text
    assert "line 60\n" in text and "line 99\n" in text and "line 59\n" not in text


def test_children_run_without_systemd_variables(tmp_path, monkeypatch) -> None:
    for name in ("INVOCATION_ID", "JOURNAL_STREAM", "NOTIFY_SOCKET"):
        monkeypatch.setenv(name, "1")
    check = make_check(tmp_path)
    code = "import os; print(sorted(k for k in os.environ if k in {'INVOCATION_ID','JOURNAL_STREAM','NOTIFY_SOCKET'}))"
    r = check.run([sys.executable, "-c", code], 60)
    assert r.ok and r.log.strip() == "[]", r.log
