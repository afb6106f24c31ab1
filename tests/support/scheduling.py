"""The order in which `-n 2` hands test files to its workers: the longest first.

pytest-xdist's `--dist loadfile` gives each worker the next file when it runs dry. By default it
sorts the files by their number of tests, which puts the unit files (hundreds of parametrized
cases, a few seconds each) first and the process files of one or two long tests (a torchrun job
of four ranks, half a minute) last: one worker then ran such a file alone at the end while the
other had nothing left. Handed out longest first (the classic LPT rule), what is left at the end
is the unit files, in pieces of a second, which both workers share.

The lengths are measured, not guessed: `file_seconds.json` beside this module holds each file's
seconds (setup, call and teardown of its tests), written by `pytest -n 2 --record-file-seconds`
(a run of some files updates theirs). A file it does not know yet goes first if it starts
processes (it may be long) and last if it is a unit file; a stale figure only costs balance,
never a test.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

SECONDS_FILE = Path(__file__).with_name("file_seconds.json")
#: Where tests that start processes live (tests/conftest.py marks them by this folder).
PROCESS_DIR = "tests/process/"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The recorded seconds of each test file; empty when the file is missing or unreadable (the
    order then falls back to process files first)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """`items` grouped by file, the files in descending recorded seconds; an unknown process file
    counts as the longest, an unknown unit file as 0. Stable: ties keep the collection order, and
    so does every file's own tests."""
    longest = max(seconds.values(), default=0.0) + 1.0

    def cost(path: str) -> float:
        if path in seconds:
            return seconds[path]
        return longest if path.startswith(PROCESS_DIR) else 0.0

    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[file_of(item.nodeid)].append(item)
    files = sorted(by_file, key=lambda path: -cost(path))
    return [item for path in files for item in by_file[path]]


class FileSeconds:
    """Sums each file's test durations as the reports arrive (from the workers too) and writes
    them, rounded, when the session ends."""

    def __init__(self, path: Path = SECONDS_FILE) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """A run of some files updates theirs; the figures of files that are gone are dropped."""
        if not self.seconds:
            return
        merged = {**load_seconds(self.path), **self.seconds}
        root = session.config.rootpath
        kept = {k: round(v, 1) for k, v in sorted(merged.items()) if (root / k).is_file()}
        self.path.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
