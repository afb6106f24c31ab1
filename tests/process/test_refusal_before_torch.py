"""A start refused for its command line, environment or config answers before torch's import
(2-3 s of CPU, more than the refusal itself): an operator's typo costs well under a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import DAEMON_MODULES
from andrea.daemon.runtime.exitcodes import ExitCode


def _refused(run_dir: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """The start's stderr under `-X importtime` (which lists every module the process imported)."""
    cmd = [sys.executable, "-X", "importtime", "-m", DAEMON_MODULES["trainer"]]
    res = subprocess.run(
        [*cmd, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr[-2000:]
    return res.stderr


def _imported(stderr: str) -> set[str]:
    return {
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:")
    }


@pytest.mark.parametrize(
    "run_toml,flags,says",
    [
        ("[model]\nn_layer = -3\n", [], "model.n_layer"),
        ("", ["--preset", "andrea-tiny", "--max-steps=-5"], "max_steps (from the command line)"),
        ("[data]\nheldout_fraction = 2\n", [], "heldout_fraction"),
    ],
)
def test_a_config_refusal_never_imports_torch(
    tmp_path: Path, run_toml: str, flags: list[str], says: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if run_toml:
        (run / "run.toml").write_text('preset = "andrea-tiny"\n' + run_toml)
    stderr = _refused(run, *flags)
    assert says in stderr
    modules = _imported(stderr)
    assert "andrea.daemon.config" in modules, "the config was read"
    assert "torch" not in modules, "a refused config paid for torch's import"


def test_a_partial_torchrun_environment_is_refused_before_torch(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    stderr = _refused(tmp_path / "run", "--preset", "andrea-tiny", env=env)
    assert "incomplete distributed environment" in stderr
    assert "torch" not in _imported(stderr)
