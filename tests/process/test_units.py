"""The systemd units: valid for systemd itself, and in agreement with the daemons' contracts."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from andrea.daemon.runtime.exitcodes import NO_RESTART, ExitCode
from tests.support.units import installed, unit


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    d = installed(tmp_path)
    for template, instance in [
        ("andrea-trainer@.service", "andrea-trainer@demo.service"),
        ("andrea-proxy@.service", "andrea-proxy@demo.service"),
        ("andrea@.target", "andrea@demo.target"),
    ]:
        shutil.copy(d / template, d / instance)
    res = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            *(
                str(d / n)
                for n in (
                    "andrea-trainer@demo.service",
                    "andrea-proxy@demo.service",
                    "andrea@demo.target",
                )
            ),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr


def test_units_follow_the_daemons_contracts(tmp_path: Path) -> None:
    d = installed(tmp_path)
    trainer = unit(d / "andrea-trainer@.service")["Service"]
    proxy = unit(d / "andrea-proxy@.service")["Service"]
    assert "@ANDREA_HOME@" not in (d / "andrea-trainer@.service").read_text()
    for svc in (trainer, proxy):
        assert svc["Type"] == "notify"
        assert svc["KillMode"] == "mixed"
        assert "PrivateDevices" not in svc, "it hides /dev/nvidia* and breaks CUDA"
        assert svc["RuntimeDirectoryMode"] == "0700"
    # The codes after which a restart can only repeat the failure are exactly the documented ones.
    assert {int(c) for c in trainer["RestartPreventExitStatus"].split()} == {
        int(c) for c in NO_RESTART
    }
    assert ExitCode.CHECKPOINT_FAILED not in NO_RESTART  # a full disk may be freed: restart
    # Reload must wait for the checkpoint; a bare kill -USR1 returns before it is durable.
    assert "checkpoint --wait" in trainer["ExecReload"] and "kill" not in trainer["ExecReload"]
    assert "--mixing proxy" in trainer["ExecStart"]


def seconds(span: str) -> float:
    value, unit_ = re.fullmatch(r"(\d+)\s*(s|min|h)", span).groups()
    return int(value) * {"s": 1, "min": 60, "h": 3600}[unit_]


def test_units_run_unprivileged_start_together_and_stop_a_crash_loop(tmp_path: Path) -> None:
    d = installed(tmp_path)
    trainer = unit(d / "andrea-trainer@.service")
    proxy = unit(d / "andrea-proxy@.service")
    target = unit(d / "andrea@.target")["Unit"]
    # The trainer starts after the proxy, so that a stop runs the other way round (its final loss
    # records reach the proxy); the proxy is ready before it waits for run.toml (no deadlock).
    assert trainer["Unit"]["After"] == "andrea-proxy@%i.service"
    assert "After" not in proxy["Unit"] and "Before" not in proxy["Unit"]
    for u in (trainer, proxy):
        assert u["Service"]["User"] == "andrea" and "DynamicUser" not in u["Service"]
        # Restarts every RestartSec reach the burst well within the interval: the limit trips.
        burst = int(u["Unit"]["StartLimitBurst"])
        interval = seconds(u["Unit"]["StartLimitIntervalSec"])
        assert burst > 1 and burst * seconds(u["Service"]["RestartSec"]) < interval / 2
    # A start of the target returns once both daemons are ready.
    assert set(target["After"].split()) == {"andrea-proxy@%i.service", "andrea-trainer@%i.service"}
