"""scripts/gpu_check.py's plumbing that runs children (tests/unit/test_gpu_check.py has the rest):
a section's budget bounds what is left, a failed child leaves its last 40 lines in the report, and
children run without the systemd variables that would send their logs to the journal."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

from tests.support.daemons import REPO

_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check
_spec.loader.exec_module(gpu_check)


def make_check(tmp_path: Path, dry_run: bool = True) -> gpu_check.Check:
    report = tmp_path / "report"
    report.mkdir()
    return gpu_check.Check(dry_run, tmp_path, tmp_path / "cache", time.monotonic() + 120, report)


def report(check: gpu_check.Check) -> str:
    return (check.report_dir / "report.md").read_text()


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
