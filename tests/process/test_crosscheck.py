"""Re-signed manifest edits (issue 24, item 9): a manifest whose `adam_step`, or a data cursor's
position or epoch, was edited and its `content_sha256` recomputed as documented is intact by its
hash, and was resumed silently. A resume cross-checks what something else fixes — Adam's step
count against the step and the schedule, each cursor against the batch its arm last drew, as the
records hold it — and skips such a checkpoint as damaged, naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from andrea.daemon.rundir.layout import LOSS_FILE, bin_name, manifest_name
from andrea.daemon.rundir.losslog import read_entries
from tests.support.daemons import run_trainer
from tests.support.manifests import edit_manifest, move_cursor

#: The data order's seed: the one the manifests of `hostile.snapshot` record.


# ---- with the real trainer ---------------------------------------------------------------------


def test_re_signed_edits_are_skipped_and_the_weights_are_those_of_the_run(
    tmp_path: Path, cache_dir: Path
) -> None:
    """Checkpoints at 10, 15, 20; step 20's adam_step and step 15's cursors re-signed. The
    restart skips both, naming them, resumes from step 10, and ends with the weights of the run
    without the edits."""
    run = tmp_path / "run"
    args = ("--mixing", "fixed", "--checkpoint-every", "5", "--eval-every", "0")
    res = run_trainer(run, cache_dir, *args, "--max-steps", "20")
    assert res.returncode == 0, res.stderr
    reference = tmp_path / "reference"
    shutil.copytree(run, reference)
    assert run_trainer(reference, cache_dir, *args, "--max-steps", "25").returncode == 0

    edit_manifest(
        run, 20, lambda m: m["optimizer"].update(adam_step=m["optimizer"]["adam_step"] + 7)
    )
    man = json.loads((run / manifest_name(15)).read_text())
    drawn = {e.arm for e in read_entries(run / LOSS_FILE) if e.step <= 15}
    moved = [i for i, c in enumerate(man["data"]) if c["name"] in drawn][:2]
    assert len(moved) == 2, man["data"]

    def cursors(m: dict) -> None:
        move_cursor(m, moved[0], "position")
        move_cursor(m, moved[1], "epoch")

    edit_manifest(run, 15, cursors)
    res = run_trainer(run, cache_dir, *args, "--max-steps", "25")
    assert res.returncode == 0, res.stderr
    assert (run / bin_name(25)).read_bytes() == (reference / bin_name(25)).read_bytes()
    assert "skipping checkpoint 20: optimizer.adam_step 27 is not step 20" in res.stderr
    assert "skipping checkpoint 15: arm" in res.stderr and "cursor" in res.stderr
    assert f"resumed from {bin_name(10)}" in res.stderr
