"""The systemd units as installed by scripts/install-units.sh, read as ini sections; shared by the unit tests."""

from __future__ import annotations

import configparser
import subprocess
from pathlib import Path

from tests.support.daemons import REPO


def installed(tmp_path: Path) -> Path:
    subprocess.run(
        [str(REPO / "scripts/install-units.sh"), "--files-only", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    return tmp_path


def unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str  # systemd keys are case-sensitive
    cp.read(path)
    return cp
