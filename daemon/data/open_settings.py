"""What a start decides that a run's config may leave open: the held-out split of a new run, and the
vocabulary of the run's tokenizer. The trainer and the proxy both fill them in this way, so
that they derive the same arms, with the same identities, from the same run.toml.

- `[data] heldout_fraction` unset: a run directory that already has checkpoints and a run.toml
  without the key keeps the split its newest readable checkpoint records, none for a run that
  predates held-out splits (its data identities, and so its resume, are unchanged; a run.toml
  rewritten by hand without the key changes nothing either); any other run is new and holds out
  the default fraction.
- `[model] vocab_size` unset: the tokenizer's size rounded up to a multiple of 64 (256 for the
  byte-level tokenizer, the default every run had before); a nanoGPT meta.pkl's size as it is.
  A smaller value is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from andrea.daemon.checkpoint.manager import checkpoint_steps, read_manifest
from andrea.daemon.config import RunConfig, Windows, build_config, load_toml, with_windows
from andrea.daemon.data.heldout import DEFAULT_FRACTION
from andrea.daemon.data.nanogpt_meta import is_meta
from andrea.daemon.data.tokenizer import RunTokenizer, check_vocab, load_tokenizer, padded_vocab


@dataclass(frozen=True)
class OpenSettings:
    """A config with what the start decided, the run's tokenizer, and which held-out case
    applies (for the start log)."""

    cfg: RunConfig
    tokenizer: RunTokenizer
    heldout: str


def resolve_open_settings(cfg: RunConfig, run_dir: Path, predates_splits: bool) -> OpenSettings:
    """Settle `cfg` for the run in `run_dir`. `predates_splits`: the run has checkpoints and its
    own run.toml, so an unset heldout_fraction means a run older than splits. Unset windows are
    shifted in a new run (no checkpoint) and, in one with checkpoints, what the newest records
    (none, for a run created before the setting: fixed). TokenizerError (a ConfigError) for an
    unusable tokenizer or a vocabulary smaller than it."""
    tokenizer = load_tokenizer(cfg.data.tokenizer, run_dir)
    cfg = _resolve_vocab_size(cfg, tokenizer)
    has_checkpoints = run_dir.is_dir() and bool(checkpoint_steps(run_dir))
    cfg = with_windows(cfg, recorded_windows(run_dir) if has_checkpoints else "shifted")
    cfg, note = resolve_heldout_fraction(cfg, predates_splits, run_dir)
    return OpenSettings(cfg, tokenizer, note)


def _resolve_vocab_size(cfg: RunConfig, tokenizer: RunTokenizer) -> RunConfig:
    if "vocab_size" not in cfg.model.model_fields_set:
        # A nanoGPT character vocabulary keeps its size, as nanoGPT's train.py does: rows past it
        # would only be drawn by an early model's samples, as U+FFFD.
        size = tokenizer.n_vocab if is_meta(cfg.data.tokenizer) else padded_vocab(tokenizer.n_vocab)
        model = cfg.model.model_copy(update={"vocab_size": size})
        return cfg.model_copy(update={"model": model})
    check_vocab(cfg.model.vocab_size, tokenizer, any(s.encoded for s in cfg.data.arms))
    return cfg


def _recorded_data(run_dir: Path) -> dict | None:
    """The `[data]` settings the newest checkpoint with a verified manifest records (None when no
    manifest can be read, whose checkpoints the resume then reports)."""
    for step in checkpoint_steps(run_dir):
        try:
            data = read_manifest(run_dir, step, rng_trial=False).config.get("data")
        except (OSError, ValueError):
            continue
        return data if isinstance(data, dict) else None
    return None


def recorded_split(run_dir: Path) -> float:
    """The held-out fraction the newest checkpoint with a verified manifest records (0: none, the
    run predates splits or set 0; also when no manifest can be read)."""
    fraction = (_recorded_data(run_dir) or {}).get("heldout_fraction")
    return float(fraction) if isinstance(fraction, int | float) else 0.0


def recorded_windows(run_dir: Path) -> Windows | None:
    """The `[data] windows` the newest checkpoint with a verified manifest records: None for a
    run created before the setting (fixed windows), or when no manifest can be read."""
    windows = (_recorded_data(run_dir) or {}).get("windows")
    return windows if windows in get_args(Windows) else None


def resolve_heldout_fraction(
    cfg: RunConfig, predates_splits: bool, run_dir: Path | None = None
) -> tuple[RunConfig, str]:
    """`cfg` with the held-out fraction the run uses, and which case applies. `predates_splits`:
    the run has checkpoints and its own run.toml; then an unset fraction is the one the newest
    checkpoint in `run_dir` records."""
    fraction = cfg.data.heldout_fraction
    if fraction == 0:
        return cfg, "[data] heldout_fraction = 0: nothing is held out, no held-out evaluation"
    if fraction is not None:
        return cfg, f"[data] heldout_fraction = {fraction:g}: held-out evaluation of every arm"
    recorded = recorded_split(run_dir) if predates_splits and run_dir is not None else 0.0
    if recorded > 0:
        data = cfg.data.model_copy(update={"heldout_fraction": recorded})
        return cfg.model_copy(update={"data": data}), (
            "run.toml has no [data] heldout_fraction: keeping the run's own split, "
            f"{recorded:g} of each arm's documents, as its newest checkpoint records it"
        )
    if predates_splits:
        return cfg, (
            "this run predates held-out splits (it has checkpoints, and its run.toml has no "
            "[data] heldout_fraction): nothing is held out, no held-out evaluation"
        )
    data = cfg.data.model_copy(update={"heldout_fraction": DEFAULT_FRACTION})
    return cfg.model_copy(update={"data": data}), (
        "a new run (no checkpoint yet) without [data] heldout_fraction: holding out the default "
        f"{DEFAULT_FRACTION:g} of each arm's documents for held-out evaluation"
    )


def read_run_config(path: Path, run_dir: Path) -> RunConfig:
    """The run's config from `path` (its run.toml), settled as the trainer settles it."""
    cfg = build_config(load_toml(path), source=str(path))
    return resolve_open_settings(cfg, run_dir, predates_splits=bool(checkpoint_steps(run_dir))).cfg
