"""Documents into token files: an arm's cached token arrays (training and held-out), and the tokens
file ``andreactl tokenizer encode`` writes with the record of the tokenizer that made it.

Documents are encoded in batches by the tokenizer's batch encoder (its own threads), and each one's
ids go straight to the file of its side of the split, joined by the tokenizer's encoding of a blank
line: under the byte-level tokenizer the bytes are exactly those of the documents joined by
``\\n\\n``, as before tokenizers existed. Every file is written under a temporary name and renamed
once complete, so a stop or a crash never leaves a partial cache entry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import heldout
from .boundedio import FileRejected, read_bounded
from .durable import atomic_write_bytes, fsync_dir, tmp_path
from .sources import DataError, Stop, check_stop
from .tokenizer import BYTES, RunTokenizer

#: A batch handed to the tokenizer ends at this many documents or bytes, whichever comes first:
#: large enough to keep its threads busy, small enough to keep two batches in memory.
BATCH_DOCUMENTS = 4096
BATCH_BYTES = 4 << 20
#: How often a wait for the tokenizer looks for a stop request, in seconds.
STOP_POLL_S = 0.05
#: The most a tokens file's record may hold (it lists the inputs by name).
MAX_RECORD_BYTES = 16 << 20

Document = tuple[str, str | bytes]
#: Called with the bytes of documents encoded so far.
Progress = Callable[[int], None]


class TokenWriter:
    """One token file being written: documents joined by the separator, in order."""

    def __init__(self, path: Path, tokenizer: RunTokenizer) -> None:
        self.path = path
        self.tmp = tmp_path(path)
        self.dtype = tokenizer.dtype
        self.separator = tokenizer.separator.astype(self.dtype).tobytes()
        self.documents = 0
        self.tokens = 0
        self._file: BinaryIO = open(self.tmp, "wb")

    def add(self, ids: np.ndarray) -> None:
        if self.documents:
            self._file.write(self.separator)
            self.tokens += len(self.separator) // self.dtype.itemsize
        self._file.write(ids.astype(self.dtype, copy=False).tobytes())
        self.documents += 1
        self.tokens += int(ids.shape[0])

    def commit(self) -> None:
        """Make the file durable under its name (its directory's fsync is the caller's)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        self.tmp.unlink(missing_ok=True)


def _batches(docs: Iterable[Document]) -> Iterator[tuple[list[Document], int]]:
    batch: list[Document] = []
    size = 0
    for doc in docs:
        batch.append(doc)
        size += len(doc[1])
        if len(batch) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


def encode_documents(
    docs: Iterable[Document],
    tokenizer: RunTokenizer,
    route: Callable[[str], TokenWriter],
    should_stop: Stop = None,
    progress: Progress | None = None,
) -> None:
    """Encode `docs` in batches and add each one's ids to the writer `route(doc_id)` names.
    DataError naming a document that a subword tokenizer cannot take (not UTF-8 text);
    InterruptedError when a stop is requested, within `STOP_POLL_S`.

    The tokenizer encodes one batch on a worker thread (it releases the GIL and uses its own
    threads) while this thread reads the next batch's files and writes the previous batch's ids:
    the encoder, the slow part, never waits for either."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="encode")
    pending: tuple[list[Document], int, Future[list[np.ndarray]]] | None = None
    done = 0
    try:
        for batch, size in _batches(docs):
            check_stop(should_stop, "encoding the data")
            future = pool.submit(_encode, tokenizer, batch)
            if pending is not None:
                done += _write(*pending, route, should_stop)
                if progress is not None:
                    progress(done)
            pending = (batch, size, future)
        if pending is not None:
            done += _write(*pending, route, should_stop)
            if progress is not None:
                progress(done)
    finally:
        # A stop leaves the batch in flight to the worker: nobody waits for it.
        pool.shutdown(wait=False, cancel_futures=True)


def _write(
    batch: list[Document],
    size: int,
    future: Future[list[np.ndarray]],
    route: Callable[[str], TokenWriter],
    should_stop: Stop,
) -> int:
    """Wait for a batch's ids (looking at stop requests meanwhile) and write them."""
    while True:
        try:
            encoded = future.result(timeout=STOP_POLL_S)
            break
        except TimeoutError:
            check_stop(should_stop, "encoding the data")
    for (doc_id, _), ids in zip(batch, encoded, strict=True):
        route(doc_id).add(ids)
    return size


def _encode(tokenizer: RunTokenizer, batch: list[Document]) -> list[np.ndarray]:
    try:
        return tokenizer.encode_batch([d for _, d in batch])
    except UnicodeDecodeError:
        for doc_id, d in batch:  # which one: the slow way, once
            if isinstance(d, bytes):
                try:
                    d.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(
                        f"document {doc_id}: not UTF-8 text (byte {e.start:,}), which a subword "
                        f"tokenizer ({tokenizer.spec}) needs; convert it, or leave it out"
                    ) from None
        raise


def split_paths(cache: Path, identity: str, suffix: str) -> tuple[Path, Path]:
    """An arm's cached training tokens and held-out tokens."""
    return cache / f"{identity}.{suffix}", cache / f"{identity}.heldout.{suffix}"


def counts_path(cache: Path, identity: str) -> Path:
    """`[documents, documents held out]` of an arm's split."""
    return cache / f"{identity}.docs.json"


def write_arm(
    cache: Path,
    identity: str,
    docs: Iterable[Document],
    tokenizer: RunTokenizer,
    fraction: float | None,
    should_stop: Stop = None,
    progress: Progress | None = None,
) -> None:
    """Encode an arm's documents into the cache under `identity`: with a held-out `fraction`, the
    training tokens, the held-out tokens and the document counts (the training file last: its
    presence says the entry is complete); without one, the training tokens alone."""
    train_path, held_path = split_paths(cache, identity, tokenizer.suffix)
    train = TokenWriter(train_path, tokenizer)
    held = TokenWriter(held_path, tokenizer) if fraction else None

    def route(doc_id: str) -> TokenWriter:
        if held is not None and heldout.is_held_out(doc_id, fraction or 0.0):
            return held
        return train

    try:
        encode_documents(docs, tokenizer, route, should_stop, progress)
        if held is not None:
            held.commit()
            counts = [train.documents + held.documents, held.documents]
            atomic_write_bytes(counts_path(cache, identity), json.dumps(counts).encode())
        train.commit()
    except BaseException:
        train.abort()
        if held is not None:
            held.abort()
        raise
    fsync_dir(cache)


class TokensRecord(BaseModel):
    """``FILE.json`` beside a tokens file that ``andreactl tokenizer encode`` wrote: which tokenizer
    made its ids. A tokens arm's file without one comes from an unknown tokenizer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["andrea-tokens/1"] = "andrea-tokens/1"
    tokenizer: str = Field(
        description='"bytes", or the sha256 of the tokenizer.json that encoded the file'
    )
    tokenizer_file: str | None = Field(None, description="where that tokenizer was read from")
    n_vocab: int = Field(ge=1, description="ids the tokenizer has")
    dtype: Literal["uint8", "uint16", "uint32"]
    tokens: int = Field(ge=0)
    documents: int = Field(ge=0)
    separator: list[int] = Field(description="the ids between two documents")
    sources: list[str] = Field(description="the input files, in the order they were encoded")
    created_utc: str


def record_path(tokens_file: Path) -> Path:
    """The record of a tokens file: ``web.u16`` → ``web.u16.json``."""
    return tokens_file.with_name(tokens_file.name + ".json")


def read_record(tokens_file: Path) -> TokensRecord | None:
    """The record beside `tokens_file`; None when it has none. DataError naming a damaged one."""
    path = record_path(tokens_file)
    try:
        raw = read_bounded(path, MAX_RECORD_BYTES, follow_symlinks=True)
        return TokensRecord.model_validate_json(raw)
    except FileNotFoundError:
        return None
    except (FileRejected, OSError, ValidationError) as e:
        raise DataError(f"{path}: not a usable tokens record ({str(e).splitlines()[0]})") from None


def write_tokens_file(
    out: Path,
    docs: Iterable[Document],
    tokenizer: RunTokenizer,
    sources: list[str],
    should_stop: Stop = None,
    progress: Progress | None = None,
) -> TokensRecord:
    """Encode `docs` into the tokens file `out` and write its record beside it (after the file:
    a file without its record is taken for an unknown tokenizer's, never the reverse)."""
    writer = TokenWriter(out, tokenizer)
    try:
        encode_documents(docs, tokenizer, lambda _: writer, should_stop, progress)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    record = TokensRecord(
        tokenizer=tokenizer.identity,
        tokenizer_file=None if tokenizer.identity == BYTES else tokenizer.spec,
        n_vocab=tokenizer.n_vocab,
        dtype=writer.dtype.name,
        tokens=writer.tokens,
        documents=writer.documents,
        separator=tokenizer.separator.tolist(),
        sources=sources,
        created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    atomic_write_bytes(record_path(out), record.model_dump_json(indent=1).encode())
    return record
