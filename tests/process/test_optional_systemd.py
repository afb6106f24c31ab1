"""systemd-python is optional at run time (a bare GPU machine may not be able to build it,
scripts/gpu_wheels.sh): without it a daemon started by systemd runs, and says once that its
notifications are off."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_SYSTEMD = """
import logging, sys
sys.modules["systemd"] = None  # as on a machine where it is not installed: its import fails
from andrea.daemon.runtime.logsetup import setup_logging
from andrea.daemon.runtime.sdnotify import Notifier
setup_logging("INFO")
for rank0 in (True, True, False):
    n = Notifier(enabled=rank0)
    n.ready("step 0/1"); n.status("x"); n.tick(); n.extend_timeout(5.0); n.stopping()
    assert not n.enabled
print("ok")
"""


def test_without_systemd_python_notifications_are_off_with_one_warning(tmp_path) -> None:
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify"), "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [sys.executable, "-c", WITHOUT_SYSTEMD], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert res.stderr.count("systemd-python is not installed") == 1, res.stderr
