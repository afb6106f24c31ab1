"""`[data] windows` across restarts, with real trainer processes: a run created before the setting
(its recorded config without it) resumes with its fixed windows, bit for bit as if never stopped;
a new run gets shifted windows, recorded; changing them in a run with checkpoints is refused naming
the setting, and made on purpose (--allow-config-change), the arms start again under the new
windows."""

from __future__ import annotations

import tomllib
from pathlib import Path

from andrea.daemon.rundir.layout import APPLIED_CONFIG_FILE, RESOLVED_CONFIG_FILE
from andrea.daemon.rundir.losslog import read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import run_trainer

FIXED = '[data]\nwindows = "fixed"\n'


def losses(run: Path) -> list[tuple[int, str, float, str]]:
    return [(e.step, e.arm, e.loss, e.batch_sha256) for e in read_entries(run / ".loss.json")]


def forget_windows(run: Path) -> None:
    """Make the run look created before the setting: no `windows` in any of its config files."""
    for name in ("run.toml", RESOLVED_CONFIG_FILE, APPLIED_CONFIG_FILE):
        path = run / name
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(x for x in lines if not x.startswith("windows = ")))


def test_a_run_from_before_the_setting_resumes_with_its_own_windows(
    tmp_path: Path, cache_dir: Path
) -> None:
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / "run.toml").write_text(FIXED)
    assert run_trainer(whole, cache_dir, "--max-steps", "16").returncode == ExitCode.OK

    old = tmp_path / "old"
    old.mkdir()
    (old / "run.toml").write_text(FIXED)
    res = run_trainer(old, cache_dir, "--max-steps", "8", "--checkpoint-every", "8")
    assert res.returncode == ExitCode.OK, res.stderr
    forget_windows(old)
    res = run_trainer(old, cache_dir, "--max-steps", "16")
    assert res.returncode == ExitCode.OK and "resumed from step_000008.bin" in res.stderr, (
        res.stderr
    )
    assert "windows" not in tomllib.loads((old / RESOLVED_CONFIG_FILE).read_text())["data"]
    assert losses(old) == losses(whole)


def test_a_new_run_is_shifted_and_a_change_of_windows_is_refused_then_made(
    tmp_path: Path, cache_dir: Path
) -> None:
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--max-steps", "8", "--checkpoint-every", "8")
    assert res.returncode == ExitCode.OK, res.stderr
    assert tomllib.loads((run / RESOLVED_CONFIG_FILE).read_text())["data"]["windows"] == "shifted"
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    (fixed / "run.toml").write_text(FIXED)
    assert run_trainer(fixed, cache_dir, "--max-steps", "8").returncode == ExitCode.OK
    # The same seed and arms, other windows: other batches from the first step.
    assert [x[3] for x in losses(run)] != [x[3] for x in losses(fixed)]

    text = (run / "run.toml").read_text().replace('windows = "shifted"', 'windows = "fixed"')
    (run / "run.toml").write_text(text)
    res = run_trainer(run, cache_dir, "--max-steps", "12")
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "data.windows: shifted → fixed" in res.stderr and "--allow-config-change" in res.stderr
    res = run_trainer(run, cache_dir, "--max-steps", "12", "--allow-config-change")
    assert res.returncode == ExitCode.OK, res.stderr
    assert "is cut into other windows ([data] windows)" in res.stderr, res.stderr
    assert tomllib.loads((run / RESOLVED_CONFIG_FILE).read_text())["data"]["windows"] == "fixed"


def test_a_run_toml_rewritten_without_the_setting_keeps_the_runs_windows(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A person's run.toml that leaves `windows` out (rewritten by hand, or from an older template)
    changes nothing: the run keeps the windows its checkpoints record, and so does a run that
    lost its run.toml and recorded config altogether."""
    run = tmp_path / "run"
    res = run_trainer(run, cache_dir, "--max-steps", "8", "--checkpoint-every", "4")
    assert res.returncode == ExitCode.OK, res.stderr
    forget_windows(run)
    res = run_trainer(run, cache_dir, "--max-steps", "12", "--checkpoint-every", "4")
    assert res.returncode == ExitCode.OK and "resumed from step_000008.bin" in res.stderr, (
        res.stderr
    )
    for name in ("run.toml", RESOLVED_CONFIG_FILE, APPLIED_CONFIG_FILE):
        (run / name).unlink()
    res = run_trainer(run, cache_dir, "--max-steps", "16", "--checkpoint-every", "4")
    assert res.returncode == ExitCode.OK and "resumed from step_000012.bin" in res.stderr, (
        res.stderr
    )
    whole = tmp_path / "whole"
    assert run_trainer(whole, cache_dir, "--max-steps", "16").returncode == ExitCode.OK
    assert losses(run) == losses(whole)
