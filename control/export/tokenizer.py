"""The tokenizer of an export: which one the checkpoint's data was encoded with, its file copied as
``tokenizer.json`` (checked against the manifest's sha256 on both sides), and the README's lines
that encode and decode with it.

A run of the byte-level tokenizer ships no file (token = byte value). A subword run ships the
``tokenizer.json`` its manifest names by sha256: the file at the run's ``[data] tokenizer`` must
still be that one, or the export is refused, since ids mean nothing without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import DataConfig
from andrea.daemon.data.arms import check_tokenizers
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.data.sources import DataError
from andrea.daemon.data.tokenizer import (
    BYTES,
    MAX_TOKENIZER_BYTES,
    ByteTokenizer,
    FileTokenizer,
    RunTokenizer,
    TokenizerError,
    tokenizer_bytes,
    tokenizer_path,
)
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded

#: The tokenizer's name in an export.
TOKENIZER_NAME = "tokenizer.json"


class TokenizerProblem(ValueError):
    """The run's tokenizer is missing, unreadable, or not the one the checkpoint was trained with."""


class ExportTokenizer(BaseModel):
    """``export.json``'s record of the tokenizer that turns the model's ids into text."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["bytes", "file"] = Field(
        description="bytes: token = byte value, no file; file: the tokenizer.json of the export"
    )
    file: str | None = Field(description="tokenizer.json, in the export folder")
    sha256: str | None = Field(
        description="the file's sha256, as the checkpoint's manifest names it"
    )
    n_vocab: int = Field(description="ids the tokenizer has (the model's vocab_size may be larger)")
    source: str | None = Field(description="where it was read from: the run's [data] tokenizer")


def run_tokenizer(run_dir: Path, manifest: Manifest) -> tuple[RunTokenizer, bytes | None]:
    """The tokenizer the checkpoint was trained with, from the run directory, and its file's
    bytes (None for the byte-level one). TokenizerProblem when the file is not that one, or not
    a regular file where `[data] tokenizer` says (an export follows no link)."""
    if manifest.tokenizer == BYTES:
        return ByteTokenizer(), None
    spec = str(manifest.config.get("data", {}).get("tokenizer", ""))
    path = tokenizer_path(spec, run_dir)
    try:
        # A nanoGPT meta.pkl gives the tokenizers file built from it: what the export ships.
        path, raw = tokenizer_bytes(spec, run_dir, follow_symlinks=False)
    except TokenizerError as e:
        raise TokenizerProblem(str(e)) from None
    except (FileRejected, OSError) as e:
        raise TokenizerProblem(
            f"the run's tokenizer {path} ([data] tokenizer = {spec!r}) cannot be read: {e}"
        ) from None
    try:
        tokenizer = FileTokenizer(spec, path, raw)
    except TokenizerError as e:
        raise TokenizerProblem(str(e)) from None
    if tokenizer.identity != manifest.tokenizer:
        raise TokenizerProblem(
            f"the run's tokenizer {path} has sha256 {tokenizer.identity}, but step "
            f"{manifest.step} was trained with the tokenizer of sha256 {manifest.tokenizer}: "
            "restore that file to export this checkpoint"
        )
    return tokenizer, raw


def load_export_tokenizer(export_dir: Path, manifest: Manifest) -> RunTokenizer:
    """The tokenizer of an export folder, its sha256 checked against the manifest: what turns the
    model's ids into text (andrea.daemon.data.tokenizer.RunTokenizer: encode, decode)."""
    if manifest.tokenizer == BYTES:
        return ByteTokenizer()
    path = export_dir / TOKENIZER_NAME
    tokenizer = FileTokenizer(TOKENIZER_NAME, path, read_bounded(path, MAX_TOKENIZER_BYTES))
    if tokenizer.identity != manifest.tokenizer:
        raise TokenizerProblem(
            f"{path} has sha256 {tokenizer.identity}, the manifest names {manifest.tokenizer}"
        )
    return tokenizer


def record(tokenizer: RunTokenizer, file: tuple[bytes, Path] | None) -> ExportTokenizer:
    """What export.json says of `tokenizer`, read from `file` (its bytes and path)."""
    source = file[1] if file is not None else None
    if tokenizer.identity == BYTES:
        return ExportTokenizer(kind="bytes", file=None, sha256=None, n_vocab=256, source=None)
    return ExportTokenizer(
        kind="file",
        file=TOKENIZER_NAME,
        sha256=tokenizer.identity,
        n_vocab=tokenizer.n_vocab,
        source=str(source) if source is not None else None,
    )


def readme_fields(tokenizer: RunTokenizer, note: str = "") -> dict[str, str]:
    """The README's tokenizer sentence (`note` after it: `unknown_note`) and its encode/decode
    lines, for this export."""
    if tokenizer.identity == BYTES:
        return {
            "tokenizer_line": "byte-level tokens (token = byte value, 256 ids; no tokenizer file)"
            + note,
            "tokenizer_row": "",
            "encode_lines": 'ids = list("def ".encode("utf-8"))            # byte-level: token = byte',
            "decode_lines": 'print(bytes(i for i in out[0].tolist() if i < 256).decode("utf-8", "replace"))',
        }
    return {
        "tokenizer_line": (
            f"tokens of the subword tokenizer `{TOKENIZER_NAME}` ({tokenizer.n_vocab:,} ids, "
            f"sha256 `{tokenizer.identity}`)" + note
        ),
        "tokenizer_row": (
            f"| `{TOKENIZER_NAME}` | the run's tokenizer (Hugging Face `tokenizers`), the one its "
            "data was encoded with: it turns text into the model's ids and back |\n"
        ),
        "encode_lines": (
            "from tokenizers import Tokenizer\n"
            f'tok = Tokenizer.from_file("{TOKENIZER_NAME}")\n'
            'ids = tok.encode("def ", add_special_tokens=False).ids'
        ),
        "decode_lines": "print(tok.decode(out[0].tolist()))",
    }


def _of_ids(kind: object) -> bool:
    found = kinds.find(kind)
    return found is not None and not found.encoded


def unknown_makers(run_dir: Path, manifest: Manifest) -> list[str]:
    """The checkpoint's tokens arms whose files say no tokenizer made them, one line each: their
    ids were read as the run's tokenizer's, which an export then ships, and nothing proves it is
    the one that made them (a nanoGPT GPT-2 ``train.bin`` under the byte-level tokenizer
    decodes as noise). An export says so in its log and README; it is not refused, since the
    weights are what they are."""
    data = manifest.config.get("data", {})
    arms = data.get("arms", []) if isinstance(data, dict) else []
    if not any(isinstance(a, dict) and _of_ids(a.get("kind")) for a in arms):
        return []
    try:
        cfg = DataConfig.model_validate(data)
        return [line for _, line in check_tokenizers(cfg, run_dir, manifest.tokenizer)]
    except (ValidationError, DataError, OSError) as e:
        return [
            f"which tokenizer made the run's tokens arms cannot be told ({str(e).splitlines()[0]})"
        ]


def unknown_note(unknown: list[str]) -> str:
    """The README's warning, after its tokenizer sentence, when `unknown_makers` found any."""
    if not unknown:
        return ""
    return (
        " **Warning: the tokenizer of some training data is unknown**, so text decoded with this "
        "one may be wrong: " + "; ".join(unknown)
    )


def round_trip_text(tokenizer: RunTokenizer, text: str) -> str:
    """The part of `text` the export's round trip (decode(encode(text)) == text) proves the
    tokenizer on: all of it, but for a character vocabulary (a nanoGPT meta.pkl's), which
    encodes the characters it lacks as a stand-in, the characters it has."""
    hf = getattr(tokenizer, "hf", None)
    vocab = hf.get_vocab() if hf is not None else {}
    if vocab and all(len(token) == 1 for token in vocab):
        return "".join(c for c in text if c in vocab)
    return text
