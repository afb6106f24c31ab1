"""The operator's read commands on a hostile `.loss.json` (issue: bounded reads): a symlink to
/dev/zero, or a sparse 64 GiB file, is refused at once with exit 2 and left as it is; nothing is
allocated for it (the process runs under a 4 GiB address-space limit to prove it)."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

from tests.support.daemons import andreactl

GIB = 1 << 30


def _limited() -> None:
    # torch and numpy map a few hundred MiB at import; 4 GiB is far below what either file
    # would need if it were read whole, so an unbounded read fails here rather than passing.
    resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))


def ctl(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return andreactl(run_dir, *args, timeout=60, preexec_fn=_limited)


@pytest.mark.parametrize("command", [("history",), ("plot", "--out", "x.png")])
def test_loss_log_linked_to_dev_zero_is_refused(tmp_path: Path, command: tuple[str, ...]) -> None:
    (tmp_path / ".loss.json").symlink_to("/dev/zero")
    res = ctl(tmp_path, *command)
    assert res.returncode == 2, res.stderr
    assert "not a regular file" in res.stderr and "Traceback" not in res.stderr
    assert os.readlink(tmp_path / ".loss.json") == "/dev/zero"


def test_sparse_64_gib_loss_log_is_refused_and_left_alone(tmp_path: Path) -> None:
    log = tmp_path / ".loss.json"
    with log.open("wb") as f:
        f.truncate(64 * GIB)
    res = ctl(tmp_path, "history")
    assert res.returncode == 2, res.stderr
    assert "NUL bytes at the end" in res.stderr and "Traceback" not in res.stderr
    assert log.stat().st_size == 64 * GIB
