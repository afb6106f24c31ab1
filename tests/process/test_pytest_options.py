"""The suite's pytest options: a plain pytest without pytest-xdist starts (the GPU machine's own
pytest runs the CUDA unit tests), and `-n 2`, as .ci/run and the README run it, still gives each
test file to one worker.

The inner runs leave out Hypothesis's pytest plugin (`-p no:hypothesispytest`): importing it is
most of a small run's CPU, and none of these options concerns it."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.daemons import REPO

SMALL = "tests/unit/test_exitcodes.py"
#: Plugins the inner runs do without; Hypothesis's alone costs 1.3 s of CPU a process.
INNER = ["-p", "no:randomly", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]


def pytest_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *INNER, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_plain_pytest_without_xdist_starts() -> None:
    r = pytest_run("-p", "no:xdist", "-q", SMALL)
    assert r.returncode == 0, r.stdout + r.stderr


def test_two_workers_distribute_by_file_unless_told_otherwise() -> None:
    r = pytest_run("-n", "2", "-v", SMALL)
    assert r.returncode == 0 and "via LoadFileScheduling" in r.stdout, r.stdout + r.stderr
    r = pytest_run("-n", "1", "-v", "--dist", "load", SMALL)  # an explicit --dist wins
    assert r.returncode == 0 and "via LoadScheduling" in r.stdout, r.stdout + r.stderr


def test_workers_take_the_files_longest_first() -> None:
    """One worker runs the files in the order -n hands them out: the recorded seconds' order
    (tests/support/scheduling.py), not xdist's own (most tests first) or the command line's."""
    recorded = json.loads((REPO / "tests" / "support" / "file_seconds.json").read_text())
    # Their numbers of tests (10, 2) give xdist's own order; their seconds the reverse. Two cheap
    # files: the inner run runs them.
    files = [SMALL, "tests/unit/test_report_schemas.py"]
    expected = sorted(files, key=lambda f: -recorded[f])
    assert expected == files[::-1], "pick two files whose seconds and numbers of tests disagree"
    r = pytest_run("-n", "1", "-v", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    ran = [
        line.split("PASSED ", 1)[1].split("::")[0]
        for line in r.stdout.splitlines()
        if "PASSED " in line
    ]
    assert list(dict.fromkeys(ran)) == expected, r.stdout
