"""Token files as the tools people use write them, opened by what the file itself says.

A tokens arm's file is a flat array of little-endian unsigned ids. How wide each id is must be
said, never guessed (a nanoGPT ``train.bin`` of uint16 ids read as uint8 trains on its zero high
bytes and counts twice its tokens). Who says it, first to last:

- **llm.c's header**: 256 int32 before the ids, ``[magic, version, tokens, 0...]``; magic 20240520
  holds uint16 ids (GPT-2), 20240801 uint32 ids (Llama 3). The ids start after its 1,024 bytes,
  and their count must be the header's;
- **the arm's ``dtype``** in run.toml;
- **the record** ``FILE.json`` that ``andreactl tokenizer encode`` writes beside it
  (daemon/data/encoding.py);
- **a nanoGPT ``meta.pkl``** beside it: nanoGPT's ``prepare.py`` writes uint16 ids, always.

A file none of them speaks for is refused naming the arm (`WidthUnknown`, exit 2), and so is a
``dtype`` that contradicts the header or the record. The held-out side of an arm may be a file of
its own (``heldout_path``: nanoGPT's ``val.bin``, llm.c's ``..._val.bin``), opened by the same rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from andrea.daemon.data.encoding import TokensRecord, record_path
from andrea.daemon.data.nanogpt_meta import META_NAME
from andrea.daemon.data.sources import DataError, SourceRejected
from andrea.daemon.data.tokenizer import BYTES, RunTokenizer
from andrea.daemon.rundir.boundedio import irregular
from andrea.daemon.rundir.durable import atomic_write_bytes

#: llm.c's header: 256 int32, the ids after it.
LLMC_HEADER_INTS = 256
LLMC_HEADER_BYTES = 4 * LLMC_HEADER_INTS
#: llm.c's magic numbers and the ids each one says the file holds.
LLMC_MAGIC = {20240520: "uint16", 20240801: "uint32"}
#: What nanoGPT's prepare.py writes (np.uint16, whatever the vocabulary).
NANOGPT_DTYPE = "uint16"


class WidthUnknown(SourceRejected):
    """Nothing says how wide a token file's ids are: the config must (exit 2, as a config error)."""


@dataclass(frozen=True)
class TokenLayout:
    """A token file's ids: where they are, their type, and who said so."""

    path: Path
    dtype: np.dtype
    offset: int
    count: int
    said_by: str

    def tokens(self) -> np.ndarray:
        """The ids, memory-mapped read-only."""
        if self.count == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, self.dtype, "r", offset=self.offset, shape=(self.count,))


def llmc_header(path: Path, size: int) -> tuple[int, int, int] | None:
    """(magic, version, tokens) of an llm.c token file, None for a file without its header."""
    if size < LLMC_HEADER_BYTES:
        return None
    with path.open("rb") as f:
        head = np.frombuffer(f.read(LLMC_HEADER_BYTES), dtype="<i4")
    if head.shape[0] < LLMC_HEADER_INTS or int(head[0]) not in LLMC_MAGIC:
        return None
    return int(head[0]), int(head[1]), int(head[2])


def _regular(label: str, path: Path, what: str) -> os.stat_result:
    try:
        kind = irregular(path, follow_symlinks=True)
    except FileNotFoundError:
        raise DataError(f"{label}: {what} {path} does not exist") from None
    if kind is not None:
        raise SourceRejected(
            f"{label}: {what} {path} is not a regular file ({kind}); set the arm's "
            "path to a file of token ids"
        )
    st = path.stat()
    if st.st_size == 0:
        raise DataError(f"{label}: {what} {path} is empty")
    return st


def _from_header(
    label: str, path: Path, size: int, head: tuple[int, int, int], declared: str | None
) -> TokenLayout:
    magic, version, count = head
    dtype = np.dtype(LLMC_MAGIC[magic]).newbyteorder("<")
    said = f"llm.c header (magic {magic}, version {version})"
    if declared is not None and declared != dtype.name:
        raise DataError(
            f"{label}: {path} has an {said}: its ids are {dtype.name}, the arm's dtype is "
            f"{declared}; set dtype = {dtype.name!r}, or leave it out"
        )
    held = size - LLMC_HEADER_BYTES
    if count < 0 or held != count * dtype.itemsize:
        raise DataError(
            f"{label}: {path}'s {said} says it holds {count:,} tokens "
            f"({count * dtype.itemsize:,} bytes of {dtype.name}), but {held:,} bytes follow the "
            "header: the file is truncated, or was written by something else; write it again"
        )
    return TokenLayout(path, dtype, LLMC_HEADER_BYTES, count, said)


def open_token_file(
    label: str,
    path: Path,
    declared: str | None,
    recorded: str | None,
    named: Path,
    what: str = "token file",
) -> TokenLayout:
    """The ids of the token file `path` (`named`: the path as the arm names it, beside which a
    meta.pkl is looked for), `declared` the arm's dtype and `recorded` its record's; `label`
    ("arm 'web'") begins every message. DataError for a missing, empty or inconsistent file;
    WidthUnknown when nothing says how wide its ids are; SourceRejected for what is not a
    regular file."""
    st = _regular(label, path, what)
    head = llmc_header(path, st.st_size)
    if head is not None:
        return _from_header(label, path, st.st_size, head, declared or recorded)
    if declared is not None and recorded is not None and declared != recorded:
        raise DataError(
            f"{label}: {named.name}.json says the file holds {recorded}, the arm's dtype is "
            f"{declared}; set dtype = {recorded!r}"
        )
    meta = named.parent / META_NAME
    if declared is not None:
        name, said = declared, "the arm's dtype"
    elif recorded is not None:
        name, said = recorded, f"{named.name}.json"
    elif meta.is_file():
        name, said = (
            NANOGPT_DTYPE,
            f"nanoGPT's {META_NAME} beside it (its prepare script writes uint16)",
        )
    else:
        raise WidthUnknown(
            f"{label}: nothing says how wide the ids of {what} {path} are (no dtype in the "
            f"arm, no {named.name}.json record beside it, no llm.c header, no nanoGPT {META_NAME} "
            "beside it): set dtype = \"uint16\" (nanoGPT's prepare scripts and tiktoken's GPT-2 ids), "
            '"uint32" (vocabularies above 65,536) or "uint8" (bytes; runs created before dtype '
            "had to be said read such a file as uint8); andreactl tokenizer record: --dtype"
        )
    dtype = np.dtype(name).newbyteorder("<")
    if st.st_size % dtype.itemsize:
        raise DataError(
            f"{label}: {path} is {st.st_size} bytes, not a whole number of {name} (per {said})"
        )
    return TokenLayout(path, dtype, 0, st.st_size // dtype.itemsize, said)


def validation_sibling(named: Path) -> Path | None:
    """The held-out file a training file's name suggests: nanoGPT's ``train.bin`` → ``val.bin``,
    llm.c's ``tiny_shakespeare_train.bin`` → ``tiny_shakespeare_val.bin``; None when the name holds
    no single ``train`` or no such file lies beside it."""
    if named.name.count("train") != 1:
        return None
    sibling = named.with_name(named.name.replace("train", "val"))
    return sibling if sibling.is_file() else None


def record_existing(path: Path, tokenizer: RunTokenizer, dtype: str | None) -> TokensRecord:
    """Write the record beside a token file made elsewhere (nanoGPT's, llm.c's) that says
    `tokenizer` made it: what ``andreactl tokenizer record`` does. DataError when its ids do not
    fit the tokenizer; WidthUnknown when nothing says their type."""
    file = open_token_file(str(path), path.resolve(), dtype, None, path)
    max_id = largest_id(file)
    if max_id >= tokenizer.n_vocab:
        raise DataError(
            f"{path}: holds the id {max_id:,}, and {tokenizer.describe()} has ids below "
            f"{tokenizer.n_vocab:,}: it did not make this file"
        )
    record = TokensRecord(
        tokenizer=tokenizer.identity,
        tokenizer_file=None if tokenizer.identity == BYTES else tokenizer.spec,
        n_vocab=tokenizer.n_vocab,
        dtype=file.dtype.name,
        tokens=file.count,
        documents=0,
        separator=[],
        sources=[f"{path.name}, recorded by andreactl tokenizer record (by {file.said_by})"],
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    atomic_write_bytes(record_path(path), record.model_dump_json(indent=1).encode())
    return record


def largest_id(file: TokenLayout) -> int:
    """The largest id of a token file, read in blocks."""
    tokens = file.tokens()
    step = 1 << 24
    return max((int(tokens[i : i + step].max()) for i in range(0, file.count, step)), default=0)
