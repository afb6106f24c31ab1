"""How many training tokens a run's data holds, for `andreactl plan`'s passes over it: counted
where the run has them (its newest checkpoint's manifest records each arm's training tokens), else
estimated from the arms' files. Torch-free, and nothing is tokenized.
"""

from __future__ import annotations

import io
import zlib
from dataclasses import dataclass
from pathlib import Path

from andrea.daemon.config import FILE_KINDS, ArmSpec, ConfigError, RunConfig
from andrea.daemon.data import corpus
from andrea.daemon.data.encoding import read_record
from andrea.daemon.data.parquet import text_bytes
from andrea.daemon.data.sources import DEFAULT_FIELD, DataError, arm_files
from andrea.daemon.data.token_files import open_token_file
from andrea.daemon.data.tokenizer import BYTES
from andrea.daemon.data.zstdstream import ZstdDataError, ZstdReader
from andrea.daemon.rundir.boundedio import read_json
from andrea.daemon.rundir.layout import manifest_name

#: Bytes a token of a trained (BPE) tokenizer stands for in English prose and code: the usual
#: 3.5-4.5 of GPT-2-like vocabularies; the estimate says it assumes this.
BPE_BYTES_PER_TOKEN = 4.0
#: Compressed bytes at the head of a .gz or .zst file whose ratio sizes the whole file.
RATIO_SAMPLE = 1 << 20
#: The most decompressed bytes that sample is read to (a bomb's ratio is not worth computing).
RATIO_LIMIT = 64 << 20


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
    try:
        if any(s.kind == "stdlib" for s in cfg.data.arms):
            tokens += kept * sum(p.stat().st_size for p in corpus.stdlib_files()) / per_token
        for spec in cfg.data.arms:
            # An arm whose held-out data is a file of its own trains on all of its `path`.
            share = 1.0 if spec.heldout_path is not None and kept < 1.0 else kept
            tokens += share * _arm_tokens(spec, base, per_token)
    except (DataError, ConfigError, OSError, ValueError):
        return None
    ratio = "a token a byte" if per_token == 1.0 else f"{per_token:g} bytes a token (assumed)"
    return DataTokens(
        int(tokens),
        f"estimated from the arms' file sizes at {ratio}; run the trainer once to count them",
    )


def _arm_tokens(spec: ArmSpec, base: Path, per_token: float) -> float:
    if spec.kind == "tokens":
        named = base / spec.tokens_path()
        record = read_record(named)
        recorded = record.dtype if record is not None else None
        return open_token_file(
            f"arm {spec.name!r}", named.resolve(), spec.dtype, recorded, named
        ).count
    if spec.kind in FILE_KINDS:
        files, _ = arm_files(spec, base)
        return sum(_text_size(spec, f) for f in files) / per_token
    return 0.0  # stdlib: counted once above, for all its parts


def _text_size(spec: ArmSpec, path: Path) -> float:
    """The bytes of text a file of the arm holds: a Parquet file's text column, a compressed
    file's size after decompression (estimated from its head), any other file's size."""
    if spec.kind == "parquet":
        return text_bytes(path, spec.field or DEFAULT_FIELD)
    size = path.stat().st_size
    if spec.kind != "jsonl" or not path.name.endswith((".gz", ".zst")):
        return size
    with path.open("rb") as f:
        head = f.read(RATIO_SAMPLE)
    if path.name.endswith(".gz"):
        unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = len(unzip.decompress(head, RATIO_LIMIT))
        except zlib.error:
            return size
        used = len(head) - len(unzip.unconsumed_tail) - len(unzip.unused_data)
    else:
        reader = ZstdReader(io.BytesIO(head))
        out = 0
        try:
            while out < RATIO_LIMIT and (chunk := reader.read(1 << 20)):
                out += len(chunk)
        except ZstdDataError:  # the head ends inside a frame: as expected
            pass
        used = reader.consumed
    return size * out / used if used else size
