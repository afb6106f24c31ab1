"""The torchrun unit variant: valid for systemd, and ordered as docs/distributed.md says."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.units import installed
from tests.support.units import unit as sections

UNIT = "andrea-trainer-ddp@.service"


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(min|s)?", value)
    assert m, value
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_systemd_accepts_the_torchrun_unit(tmp_path: Path) -> None:
    d = installed(tmp_path)
    names = ["andrea-trainer-ddp@demo.service", "andrea-proxy@demo.service", "andrea@demo.target"]
    for template, instance in zip([UNIT, "andrea-proxy@.service", "andrea@.target"], names):
        shutil.copy(d / template, d / instance)
    res = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(d / n) for n in names)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr


def test_torchrun_unit_contract(tmp_path: Path) -> None:
    path = installed(tmp_path) / UNIT
    cp, unit_text = sections(path), path.read_text()
    svc, head = cp["Service"], cp["Unit"]
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "all", "rank 0 is not the main pid"
    start = svc["ExecStart"]
    # The torchrun-free preflight first, as the main process (its exit code reaches systemd),
    # which then becomes torchrun.
    assert start.startswith("/bin/sh -c '")
    check, _, start = start.partition(" && exec ")
    assert '/andrea-trainer --check --world-size "$ANDREA_NPROC"' in check
    assert check.count("$ANDREA_TRAINER_ARGS") == start.count("$ANDREA_TRAINER_ARGS") == 1
    assert start.split()[0].endswith("/torchrun") and "--no-python" in start
    assert "--max-restarts 0" in start, "restarts belong to the unit"
    assert set(svc["RestartPreventExitStatus"].split()) == {"2", "4", "5"}
    # torch 2.11's torchrun refuses --shutdown-timeout; 2.12 and later read the variable.
    assert "--shutdown-timeout" not in start
    shutdown = float(re.search(r"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=(\d+)", unit_text).group(1))
    # TimeoutStopSec > the shutdown timeout > one step plus one checkpoint (the trainer also asks
    # for more time with EXTEND_TIMEOUT_USEC while it writes).
    assert seconds(svc["TimeoutStopSec"]) > shutdown >= 120
    assert "stop --wait" in svc["ExecStop"] and "$MAINPID" in svc["ExecStop"]
    assert "checkpoint --wait" in svc["ExecReload"] and "kill" not in svc["ExecReload"]
    assert svc["KillMode"] == "mixed" and "PrivateDevices" not in svc
    assert head["Conflicts"] == "andrea-trainer@%i.service"
    assert int(head["StartLimitBurst"]) >= 1
