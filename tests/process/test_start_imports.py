"""What a trainer start imports, read off `-X importtime`. A start refused for its command line,
environment or config, or for changing a run's training config, answers before torch's import
(2-3 s of CPU, more than the refusal itself): an operator's typo costs well under a second. A run
that does not compile never imports the compiler (`torch._dynamo`, 1.7 s of CPU, a third of a
start): torch.optim's AdamW would import it on its first use, so the trainer calls the same fused
kernel itself (daemon/optimizer.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import DAEMON_MODULES
from andrea.daemon.runtime.exitcodes import ExitCode


def _start(
    run_dir: Path, *args: str, env: dict[str, str] | None = None, code: int = ExitCode.CONFIG_ERROR
) -> str:
    """The start's stderr under `-X importtime` (which lists every module the process imported)."""
    cmd = [sys.executable, "-X", "importtime", "-m", DAEMON_MODULES["trainer"]]
    res = subprocess.run(
        [*cmd, "--run-dir", str(run_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == code, res.stderr[-2000:]
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
    stderr = _start(run, *flags)
    assert says in stderr
    modules = _imported(stderr)
    assert "andrea.daemon.config" in modules, "the config was read"
    assert "torch" not in modules, "a refused config paid for torch's import"


def test_a_partial_torchrun_environment_is_refused_before_torch(tmp_path: Path) -> None:
    import os

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    stderr = _start(tmp_path / "run", "--preset", "andrea-tiny", env=env)
    assert "incomplete distributed environment" in stderr
    assert "torch" not in _imported(stderr)


def test_a_run_without_compile_never_imports_the_compiler(tmp_path: Path, cache_dir: Path) -> None:
    run = tmp_path / "run"
    flags = ["--preset", "andrea-tiny", "--threads", "1", "--cache-dir", str(cache_dir)]
    flags += ["--sample-every", "0", "--compile", "off"]
    fresh = _imported(_start(run, *flags, "--max-steps", "2", code=ExitCode.OK))
    # The resume too: it loads Adam's moments from the checkpoint into the optimizer.
    resumed = _start(run, *flags, "--max-steps", "3", code=ExitCode.OK)
    assert "resumed from step_000002.bin" in resumed, resumed[-2000:]
    for modules in (fresh, _imported(resumed)):
        assert "torch" in modules and "andrea.daemon.optimizer" in modules, "it trained"
        assert "torch._dynamo" not in modules, "the compiler was imported by a run without it"
    # A resume refused for changing the trajectory reads the run's record alone: no torch.
    changed = _start(run, *flags, "--max-steps", "4", "--seed", "7", code=ExitCode.RESUME_REFUSED)
    assert "this start changes the run's training config" in changed, changed[-2000:]
    assert "torch" not in _imported(changed), "a refused config change paid for torch's import"
