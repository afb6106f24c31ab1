"""A damaged `.loss.json` or `.eval.json` (issue 24, items 5 and 15): /dev/zero, a 64 GiB sparse
file, a FIFO, a directory, or garbage in the middle. The trainer of a fixed mixture, which writes
both itself, refuses them with exit 4 and one clear line, as the proxy does (a restart cannot
cure them: systemd must not loop); and each daemon names the file that is damaged."""

from __future__ import annotations

from pathlib import Path

from andrea.daemon.rundir.layout import EVAL_FILE
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import run_trainer
from tests.support.records import damage


def test_fixed_mode_trainer_exits_4_without_a_traceback(tmp_path: Path, cache_dir: Path) -> None:
    """The whole path, once (the cases above cover every kind of damage to either file)."""
    path = damage(tmp_path, EVAL_FILE, "directory")
    res = run_trainer(tmp_path, cache_dir, "--mixing", "fixed", "--max-steps", "5")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "Traceback" not in res.stderr and "CRITICAL" not in res.stderr, res.stderr
    assert f"{path}: not a regular file" in res.stderr.splitlines()[-1], res.stderr
    assert not list(tmp_path.glob("step_*")), "nothing trained"
