"""An export of a run whose data and tokenizer are paths relative to its directory: the README's
resume recipe, followed as written from the export folder moved elsewhere, continues the run bit
for bit; every file of both export kinds has one mode; the reload-check loss stands beside the
held-out losses it is not."""

from __future__ import annotations

import json
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import bin_name
from tests.support.daemons import andreactl, run_trainer

WORDS = (
    "the trainer writes a checkpoint at every step boundary and the proxy keeps its log while "
    "each arm of data is read in order by its cursor so that a resume continues exactly"
).split()

RUN_TOML = """\
[data]
tokenizer = "tok/notes.json"
heldout_fraction = 0.25

[[data.arms]]
name = "notes"
kind = "text"
paths = ["notes/*.txt"]
"""


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A run of 40 text documents under notes/ and a tokenizer under tok/, both named relative to
    the run directory; 8 steps, checkpoints at 6 and 8."""
    run = tmp_path_factory.mktemp("relative") / "run"
    (run / "notes").mkdir(parents=True)
    rng = random.Random(34)
    for i in range(40):
        text = " ".join(rng.choice(WORDS) for _ in range(400))
        (run / "notes" / f"note-{i:02d}.txt").write_text(text + "\n")
    (run / "run.toml").write_text(RUN_TOML)
    _ok(andreactl(run, "tokenizer", "train", "--vocab-size", "300", "--cache-dir", str(cache_dir)))
    assert (run / "tok" / "notes.json").is_file()
    _ok(run_trainer(run, cache_dir, "--max-steps", "8", "--checkpoint-every", "6"))
    return run


@pytest.fixture(scope="module")
def exported(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 6 of the run, exported under a umask of 002 (a plain `open` would make 0664 files)."""
    dest = tmp_path_factory.mktemp("export") / "step6"
    _ok(andreactl(source, "export", "--to", str(dest), "--step", "6", umask=0o002))
    return dest


def _losses(run: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in json.loads((run / ".loss.json").read_text())}


def test_the_resume_recipe_works_from_the_export_folder_moved_elsewhere(
    source: Path, exported: Path, tmp_path: Path, cache_dir: Path
) -> None:
    moved = tmp_path / "elsewhere" / "export"
    shutil.copytree(exported, moved)
    readme = (moved / "README.md").read_text()
    recipe = re.search(r"## Resuming training from it\n.*?```sh\n(.*?)```", readme, re.S)
    assert recipe, readme
    lines = recipe.group(1).strip().splitlines()
    assert str(source.resolve() / "notes") in recipe.group(1)  # where the data lay, absolute
    assert lines[-1] == 'andrea-trainer --run-dir "$DIR"', lines
    # The test's trainer: this checkout's, with the test's cache, one thread and a step limit.
    trainer = f"{shlex.quote(sys.executable)} -m andrea.daemon.trainer.service.cli"
    flags = f"--threads 1 --cache-dir {shlex.quote(str(cache_dir))} --max-steps 8 --log-every 1"
    lines[-1] = lines[-1].replace("andrea-trainer", trainer) + f" {flags} --sample-every 0"
    res = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines)],
        cwd=moved,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, f"{recipe.group(1)}\n{res.stderr[-3000:]}"
    resumed = tmp_path / "elsewhere" / "resumed-run"  # DIR=../resumed-run, from the folder
    assert "resumed from step_000006.bin" in res.stderr, res.stderr[-3000:]
    assert {s: v for s, v in _losses(resumed).items() if s > 6} == {
        s: v for s, v in _losses(source).items() if s > 6
    }
    assert (resumed / bin_name(8)).read_bytes() == (source / bin_name(8)).read_bytes()


def test_every_file_of_both_export_kinds_has_one_mode(
    source: Path, exported: Path, tmp_path: Path
) -> None:
    hf = tmp_path / "hf"
    _ok(andreactl(source, "export", "--to", str(hf), "--step", "6", "--format", "hf", umask=0o002))
    for folder in (exported, hf):
        modes = {
            p.relative_to(folder).as_posix(): oct(p.stat().st_mode & 0o777)
            for p in folder.rglob("*")
            if p.is_file()
        }
        assert {"audit/plot.png", "export.json", "README.md", bin_name(6)} <= set(modes)
        assert set(modes.values()) == {"0o644"}, modes
    hub = {p.name for p in (hf / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= hub
    assert not any(n.endswith(".bin") or n == "export.json" for n in hub), "resume state beside"


def test_the_reload_check_loss_is_named_beside_the_held_out_losses(
    source: Path, exported: Path
) -> None:
    readme = (exported / "README.md").read_text()
    evals = [e for e in json.loads((source / ".eval.json").read_text()) if e["step"] == 6]
    loss = evals[-1]["arms"]["notes"]["loss"]
    assert "**reload-check loss**" in readme and "fingerprint, not a quality figure" in readme
    assert f"**held-out loss** at step 6: `notes` {loss:.4f}" in readme, readme[:3000]
