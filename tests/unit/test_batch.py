"""One meaning of batch: batch_size counts the sequences of an optimizer step over the whole job,
grad_accum splits it, each rank trains its share of every micro-batch; what does not divide is
refused naming what would; a run created under the per-micro-batch reading keeps it."""

from __future__ import annotations

from pathlib import Path

import pytest

from andrea.daemon.config import (
    ConfigError,
    build_config,
    for_new_run,
    load_toml,
    save_config,
)
from andrea.daemon.data.batch_split import batch_shape, step_sequences
from andrea.daemon.trainer.service.cli import build_parser
from andrea.daemon.trainer.service.start import resolve_config


def new_run(**values) -> object:
    return for_new_run(build_config({"preset": "andrea-tiny", **values}))


def test_a_step_is_cut_into_micro_batches_and_ranks() -> None:
    shape = batch_shape(new_run(batch_size=12, grad_accum=2), world=3)
    assert (shape.per_step, shape.micro_batch, shape.per_rank) == (12, 6, 2)
    assert shape.tokens_per_step == 12 * 64
    assert shape.describe() == (
        "batch 12 sequences per step (768 tokens) in 2 micro-batch(es) of 6 (384 tokens); "
        "each of 3 ranks: 4 sequences per step (256 tokens), 2 per micro-batch (128 tokens)"
    )


def test_a_world_size_that_cannot_share_the_batch_is_refused_naming_sizes_that_would() -> None:
    with pytest.raises(ConfigError) as e:
        batch_shape(new_run(batch_size=8, grad_accum=2), world=3)
    assert str(e.value) == (
        "batch_size 8 in 2 micro-batch(es) is 4 sequences each, which a job of 3 ranks cannot "
        "share equally: world sizes 1, 2 or 4 would work with this batch, or batch_size 6 or 12 "
        "at world size 3 (grad_accum 2)"
    )


def test_grad_accum_is_bounded_by_the_batch_it_splits() -> None:
    for accum in (10**9, 4097):
        with pytest.raises(ConfigError, match="grad_accum.*less than or equal to 4096"):
            build_config({"preset": "andrea-tiny", "grad_accum": accum})
    args = build_parser().parse_args(["--run-dir", "r", "--grad-accum", str(10**9)])
    with pytest.raises(ConfigError, match=r"grad_accum \(from the command line\)"):
        resolve_config(args, run_toml_existed=False)
    with pytest.raises(ConfigError) as e:
        new_run(batch_size=6, grad_accum=4)
    assert (
        "batch_size 6 (sequences per optimizer step) is not divisible by grad_accum 4: "
        "grad_accum 1, 2, 3 or 6 would work, or batch_size 4 or 8" in str(e.value)
    )
    with pytest.raises(ConfigError, match="not divisible by grad_accum 16"):
        new_run(batch_size=8, grad_accum=16)
    # A run counting batch_size per micro-batch: its step (batch_size x grad_accum) is bounded.
    with pytest.raises(ConfigError, match=r"batch_size 8 x grad_accum 1024 sequences per step"):
        build_config({"preset": "andrea-tiny", "batch_size": 8, "grad_accum": 1024})


def test_a_run_toml_of_the_per_micro_batch_reading_keeps_its_batches_and_its_hash() -> None:
    old = build_config({"preset": "andrea-tiny", "batch_size": 4, "grad_accum": 2})
    assert old.batch_size_per is None
    assert step_sequences(old) == 8 and batch_shape(old, 2).micro_batch == 4
    # The hash the code before batch_size_per gave this run.toml (so its checkpoints resume).
    assert old.trajectory_hash() == (
        "0618847d644a1b8ed71d3254e9fcb95fd144ac4e62117bd5e331dc67ac93ec2d"
    )
    new = new_run(batch_size=8, grad_accum=2)
    assert step_sequences(new) == 8 and batch_shape(new, 2).micro_batch == 4
    assert new.trajectory()["batch_size_per"] == "step"
    # With one micro-batch a step both readings train the same batches, and hash alike.
    one = build_config({"preset": "andrea-tiny", "batch_size": 8})
    marked = build_config({"preset": "andrea-tiny", "batch_size": 8, "batch_size_per": "step"})
    assert one.trajectory_hash() == marked.trajectory_hash()


def test_what_batch_size_counts_belongs_to_the_run(tmp_path: Path) -> None:
    parser = build_parser()
    fresh = parser.parse_args(["--run-dir", str(tmp_path / "new"), "--grad-accum", "2"])
    assert resolve_config(fresh, run_toml_existed=False).batch_size_per == "step"

    old_dir = tmp_path / "old"
    old_dir.mkdir()
    (old_dir / "run.toml").write_text('preset = "andrea-tiny"\nbatch_size = 4\ngrad_accum = 2\n')
    # The run's own file, or a --config file written for it: the run keeps its reading.
    other = tmp_path / "mine.toml"
    other.write_text('preset = "andrea-tiny"\nbatch_size = 4\ngrad_accum = 2\n')
    for argv in (["--run-dir", str(old_dir)], ["--run-dir", str(old_dir), "--config", str(other)]):
        assert resolve_config(parser.parse_args(argv), run_toml_existed=True).batch_size_per is None

    new_dir = tmp_path / "marked"
    new_dir.mkdir()
    save_config(new_run(batch_size=8, grad_accum=2), new_dir / "run.toml")
    assert load_toml(new_dir / "run.toml")["batch_size_per"] == "step"
    args = parser.parse_args(["--run-dir", str(new_dir), "--config", str(other)])
    assert resolve_config(args, run_toml_existed=True).batch_size_per == "step"


def test_run_toml_opens_with_what_its_batch_size_counts(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    save_config(new_run(batch_size=8), path)
    text = path.read_text()
    assert text.startswith("# The run's configuration, written by andrea-trainer")
    assert "# batch_size: sequences per optimizer step over the whole job" in text
    assert load_toml(path)["batch_size"] == 8


def test_an_existing_runs_refusal_names_only_what_it_can_change() -> None:
    """Issue 33, B15: a resume at a world size that cannot share the batch suggested new
    batch_size values, which an existing run (its checkpoints are of its batch) cannot take."""
    from andrea.daemon.config import ConfigError, build_config
    from andrea.daemon.data.batch_split import batch_shape

    cfg = build_config({"batch_size": 16, "grad_accum": 4, "batch_size_per": "step"})
    with pytest.raises(ConfigError) as new:
        batch_shape(cfg, 8)
    assert "or batch_size" in str(new.value)
    with pytest.raises(ConfigError) as existing:
        batch_shape(cfg, 8, existing=True)
    text = str(existing.value)
    assert "world sizes 1, 2 or 4 would work" in text, text
    assert "grad_accum 1 or 2 at world size 8 (the same 16 sequences per step)" in text, text
    assert "or batch_size" not in text and "keeps its batch_size" in text, text
