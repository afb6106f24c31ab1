"""A run created when batch_size counted one micro-batch resumes under that reading, bit-exact.

Its run.toml (as the code before batch_size_per wrote it: no batch_size_per, no held-out split)
says batch_size 4 and grad_accum 2: 4 sequences per micro-batch, 8 per step. Stopped and resumed,
it must train exactly the batches and bits of a new run whose batch_size is 8 per step in 2
micro-batches, and keep its reading in its run.toml and its trajectory hash."""

from __future__ import annotations

import json
from pathlib import Path

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from tests.support.daemons import run_trainer

STEPS = 6
#: The hash the code before batch_size_per gave this run.toml (tests/unit/test_batch.py pins it too).
OLD_HASH = "0618847d644a1b8ed71d3254e9fcb95fd144ac4e62117bd5e331dc67ac93ec2d"


def curve(run_dir: Path) -> list[tuple[int, float, str, str | None, int]]:
    entries = canonical_curve(read_entries(run_dir / ".loss.json"))
    return [(e.step, e.loss, e.arm, e.batch_sha256, e.tokens) for e in entries]


def test_a_run_of_the_per_micro_batch_reading_resumes_unchanged(
    tmp_path: Path, cache_dir: Path
) -> None:
    common = ("--checkpoint-every", "0", "--eval-every", "0")
    new = tmp_path / "new"
    res = run_trainer(
        new, cache_dir, "--max-steps", str(STEPS), "--batch-size", "8", "--grad-accum", "2",
        "--heldout-fraction", "0", "--windows", "fixed", *common,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr

    old = tmp_path / "old"
    old.mkdir()
    # No split and fixed windows, as before either existed: a run directory without checkpoints
    # is a new run, which gets the defaults of new runs unless its run.toml says otherwise.
    run_toml = (
        'preset = "andrea-tiny"\nbatch_size = 4\ngrad_accum = 2\n[data]\nheldout_fraction = 0.0\n'
        'windows = "fixed"\n'
    )
    (old / "run.toml").write_text(run_toml)
    written = []
    for steps in (STEPS // 2, STEPS):
        res = run_trainer(old, cache_dir, "--max-steps", str(steps), *common)
        assert res.returncode == 0, res.stderr
        assert "batch 8 sequences per step (512 tokens) in 2 micro-batch(es) of 4" in res.stderr
        written.append((old / "run.toml").read_text())
    assert f"resumed from {bin_name(STEPS // 2)}" in res.stderr
    # The first start records what the file left open, never what batch_size counts; the resume
    # keeps the file as it is.
    assert written[0] == written[1] and "batch_size_per" not in written[0], written[0]
    assert written[0].startswith('preset = "andrea-tiny"\nbatch_size = 4\ngrad_accum = 2\n')
    man = json.loads((old / manifest_name(STEPS)).read_text())
    assert man["config_hash"] == OLD_HASH and man["config"]["batch_size_per"] is None

    assert curve(old) == curve(new)
    assert {tokens for *_, tokens in curve(old)} == {8 * 64}
    assert (old / bin_name(STEPS)).read_bytes() == (new / bin_name(STEPS)).read_bytes()
