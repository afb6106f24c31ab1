"""An export's resume recipe provides every file an arm's kind names relative to the run
directory (control/export/resume.py, each kind's `export_paths`)."""

from __future__ import annotations

from pathlib import Path

import tomli_w


def test_a_tokens_arms_held_out_file_is_copied_beside_its_file(tmp_path: Path) -> None:
    from andrea.control.export.resume import resume_recipe

    run = tmp_path / "run"
    (run / "nano").mkdir(parents=True)
    (run / "nano" / "train.bin").write_bytes(bytes(64))
    (run / "nano" / "val.bin").write_bytes(bytes(16))
    arm = {
        "name": "ids",
        "kind": "tokens",
        "path": "nano/train.bin",
        "heldout_path": "nano/val.bin",
        "dtype": "uint8",
    }
    (run / "run.toml").write_text(tomli_w.dumps({"data": {"arms": [arm]}}))
    recipe = resume_recipe(run, "step_000010", None)
    # Without its held-out file the resumed run would refuse to start (the file is missing).
    assert f'cp {run}/nano/train.bin "$DIR"/nano/train.bin' in recipe
    assert f'cp {run}/nano/val.bin "$DIR"/nano/val.bin' in recipe
