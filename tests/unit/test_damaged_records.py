"""A damaged `.loss.json` or `.eval.json` (issue 24, items 5 and 15): /dev/zero, a 64 GiB sparse
file, a FIFO, a directory, or garbage in the middle. The trainer of a fixed mixture, which writes
both itself, refuses them with exit 4 and one clear line, as the proxy does (a restart cannot
cure them: systemd must not loop); and each daemon names the file that is damaged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from andrea.daemon.config import save_config
from andrea.daemon.data.arms import FixedMixture
from andrea.daemon.mixing import cli as proxy_cli
from andrea.daemon.rundir.layout import CONFIG_FILE, EVAL_FILE, LOSS_FILE
from andrea.daemon.rundir.losslog import LossLog
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.trainer.sink import FileSink, RecordLogRefused
from tests.support.hostile import text_arms_config
from tests.support.records import damage

KINDS = ["dev-zero", "sparse", "fifo", "directory", "garbage-mid-file"]
CASES = [(name, kind) for name in (LOSS_FILE, EVAL_FILE) for kind in KINDS]


def _state(path: Path) -> tuple:
    st = os.lstat(path)
    head = None
    if path.is_file() and not path.is_symlink():
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    return st.st_mode, st.st_size, head


@pytest.mark.parametrize("name,kind", CASES)
def test_fixed_mode_refuses_a_damaged_record_file(tmp_path: Path, name: str, kind: str) -> None:
    path = damage(tmp_path, name, kind)
    before = _state(path)
    with pytest.raises(RecordLogRefused) as refused:
        FileSink.open(tmp_path, FixedMixture(["alpha"], [1.0], seed=1), prior_segment=0)
    assert str(refused.value).startswith(f"{path}: "), refused.value
    assert _state(path) == before, "a refused file is never modified"
    if name == EVAL_FILE:  # the loss log opened first is released again
        with LossLog.open(tmp_path / LOSS_FILE):
            pass


@pytest.mark.parametrize("name,kind", CASES)
def test_the_proxy_names_the_damaged_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, kind: str
) -> None:
    save_config(text_arms_config(tmp_path), tmp_path / CONFIG_FILE)
    path = damage(tmp_path, name, kind)
    args = proxy_cli.build_parser().parse_args(["--run-dir", str(tmp_path)])
    with caplog.at_level(logging.ERROR):
        code = proxy_cli.run(args, OperatorRequests())
    assert code == ExitCode.RESUME_REFUSED, caplog.text
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    other = EVAL_FILE if name == LOSS_FILE else LOSS_FILE
    assert line.startswith(f"{path}: ") and other not in line, line
