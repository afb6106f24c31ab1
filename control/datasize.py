"""How many training tokens a run's data holds, for `andreactl plan`'s passes over it: counted
where the run has them (its newest checkpoint's manifest records each arm's training tokens), else
estimated from the arms' files. Torch-free, and nothing is tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andrea.daemon.config import ConfigError, RunConfig
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.data.sources import DataError
from andrea.daemon.data.tokenizer import BYTES
from andrea.daemon.rundir.boundedio import read_json
from andrea.daemon.rundir.layout import manifest_name

#: Bytes a token of a trained (BPE) tokenizer stands for in English prose and code: the usual
#: 3.5-4.5 of GPT-2-like vocabularies; the estimate says it assumes this.
BPE_BYTES_PER_TOKEN = 4.0


@dataclass(frozen=True)
class DataTokens:
    tokens: int
    how: str


def newest_manifest(run_dir: Path) -> dict | None:
    """The newest checkpoint's manifest as JSON, or None (no checkpoint, or unreadable). Imports
    torch (the checkpoint modules do): only `plan --run-dir` reads a manifest."""
    from andrea.daemon.checkpoint.manager import checkpoint_steps
    from andrea.daemon.checkpoint.manifest import MAX_MANIFEST_BYTES

    steps = checkpoint_steps(run_dir) if run_dir.is_dir() else []
    if not steps:
        return None
    try:
        data = read_json(run_dir / manifest_name(steps[0]), MAX_MANIFEST_BYTES)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def counted(run_dir: Path) -> DataTokens | None:
    """The training tokens of the arms of the run's newest checkpoint, as its manifest records."""
    manifest = newest_manifest(run_dir)
    if not manifest:
        return None
    cursors = manifest.get("data")
    if not isinstance(cursors, list) or not cursors:
        return None
    try:
        tokens = sum(int(c["n_tokens"]) for c in cursors)
    except (KeyError, TypeError, ValueError):
        return None
    step = manifest.get("step", "?")
    return DataTokens(
        tokens,
        f"counted: the {len(cursors)} arms' training tokens per checkpoint {step}'s manifest",
    )


def estimated(cfg: RunConfig, base: Path) -> DataTokens | None:
    """The training tokens the arms' files would make: a tokens file's ids exactly, text and JSON
    Lines at one token a byte (the bytes tokenizer) or BPE_BYTES_PER_TOKEN (a compressed file at
    its head's ratio, a Parquet file at its text column's size), the embedded corpus at its size;
    less the held-out fraction (none of an arm with a `heldout_path` file). None when an arm's
    files cannot be found or read."""
    per_token = 1.0 if cfg.data.tokenizer == BYTES else BPE_BYTES_PER_TOKEN
    kept = 1.0 - (cfg.data.heldout_fraction or 0.0)
    tokens = 0.0
    shared: dict[str, Any] = {}
    try:
        for spec in cfg.data.arms:
            kind = kinds.kind(spec.kind)
            # An arm whose held-out data is a file of its own trains on all of its `path`.
            share = 1.0 if spec.heldout_path is not None and kept < 1.0 else kept
            size = kind.size_estimate(spec, base, shared)
            tokens += share * (size / per_token if kind.encoded else size)
    except (DataError, ConfigError, OSError, ValueError):
        return None
    ratio = "a token a byte" if per_token == 1.0 else f"{per_token:g} bytes a token (assumed)"
    return DataTokens(
        int(tokens),
        f"estimated from the arms' file sizes at {ratio}; run the trainer once to count them",
    )
