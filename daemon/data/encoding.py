"""Documents into token files: an arm's cached token arrays (training and held-out), and the tokens
file ``andreactl tokenizer encode`` writes with the record of the tokenizer that made it.

Documents are encoded in batches by the tokenizer's batch encoder (its own threads), and each one's
ids go straight to the file of its side of the split, joined by the tokenizer's separator
(`RunTokenizer.separator`: its end-of-document token, else its encoding of a blank line): under the
byte-level tokenizer the bytes are exactly those of the documents joined by ``\\n\\n``, as before
tokenizers existed. Every file is written under a temporary name and renamed once complete, so a
stop or a crash never leaves a partial cache entry; an arm's encoding that a stop or a crash
interrupts is kept, though, and the next start continues it (daemon/data/partial.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.daemon.data import heldout, partial
from andrea.daemon.data.sources import DataError, Stop, check_stop
from andrea.daemon.data.tokenizer import BYTES, RunTokenizer
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes, fsync_dir, tmp_path

log = logging.getLogger(__name__)

#: A batch handed to the tokenizer ends at this many documents or bytes, whichever comes first:
#: large enough to keep its threads busy, small enough to keep two batches in memory.
BATCH_DOCUMENTS = 4096
BATCH_BYTES = 4 << 20
#: How often a wait for the tokenizer looks for a stop request, in seconds.
STOP_POLL_S = 0.05
#: Test-only pacing: seconds to wait after each batch is written (stop requests and progress still
#: answered meanwhile). A test of a first start whose encoding outlasts the unit's start timeout
#: needs an encoding longer than that timeout on any machine; nothing encoded depends on it.
PACE_ENV = "ANDREA_TEST_ENCODE_PAUSE"
#: The most a tokens file's record may hold (it lists the inputs by name).
MAX_RECORD_BYTES = 16 << 20
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
_REOPEN = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC

Document = tuple[str, str | bytes]
#: Called with the bytes and the number of the documents encoded so far.
Progress = Callable[[int, int], None]


class TokenWriter:
    """One token file being written: documents joined by the separator, in order; its size and
    sha256 are taken as it is written (what the token cache verifies an entry against). It grows
    under `tmp` (default: a temporary of this process's), or, with `prefix`, goes on from what
    `tmp` holds already (an encoding an earlier start kept: daemon/data/partial.py)."""

    def __init__(
        self,
        path: Path,
        tokenizer: RunTokenizer,
        tmp: Path | None = None,
        prefix: partial.Prefix | None = None,
    ) -> None:
        self.path = path
        self.tmp = tmp or tmp_path(path)
        self.dtype = tokenizer.dtype
        self.separator = tokenizer.separator.astype(self.dtype).tobytes()
        self.documents = 0
        self.tokens = 0
        self.sha256 = hashlib.sha256()
        # The temporary's name is known in advance: a link planted there is refused, never
        # written through.
        fd = os.open(self.tmp, _CREATE if prefix is None else _REOPEN, 0o644)
        if prefix is not None:
            # What was written after the prefix was recorded (a SIGKILL between two saves) goes.
            os.ftruncate(fd, prefix.size)
            os.lseek(fd, prefix.size, os.SEEK_SET)
            self.documents = prefix.documents
            self.tokens = prefix.size // self.dtype.itemsize
            self.sha256 = prefix.sha256
        self._file: BinaryIO = os.fdopen(fd, "wb")

    def _put(self, data: bytes) -> None:
        self._file.write(data)
        self.sha256.update(data)

    def add(self, ids: np.ndarray) -> None:
        if self.documents:
            self._put(self.separator)
            self.tokens += len(self.separator) // self.dtype.itemsize
        self._put(ids.astype(self.dtype, copy=False).tobytes())
        self.documents += 1
        self.tokens += int(ids.shape[0])

    @property
    def size(self) -> int:
        return self.tokens * self.dtype.itemsize

    def sync(self) -> None:
        """Make what is written so far durable (under the temporary name)."""
        self._file.flush()
        os.fsync(self._file.fileno())

    def commit(self) -> None:
        """Make the file durable under its name (its directory's fsync is the caller's)."""
        self.sync()
        self._file.close()
        os.replace(self.tmp, self.path)

    def close(self) -> None:
        """Close the file, keeping it under its temporary name (an encoding to continue)."""
        try:
            self._file.close()
        except OSError:
            pass

    def abort(self) -> None:
        """Remove the temporary file, whatever closing it says: on a full disk the close fails
        too (it writes what is buffered), and the file must go all the same."""
        try:
            self._file.close()
        except OSError:
            pass
        finally:
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
    InterruptedError when a stop is requested, within `STOP_POLL_S`. `progress` is called after
    each batch and every `STOP_POLL_S` while one is encoded.

    The tokenizer encodes one batch on a worker thread (it releases the GIL and uses its own
    threads) while this thread reads the next batch's files and writes the previous batch's ids:
    the encoder, the slow part, never waits for either. The worker is a daemon thread: a stop
    leaves its batch behind, and nothing waits for it, not even the interpreter's exit."""
    worker = _Worker(tokenizer)
    pending: tuple[list[Document], int, Future[list[np.ndarray]]] | None = None
    done = [0, 0]  # bytes and documents encoded
    pace = float(os.environ.get(PACE_ENV) or 0)
    if pace:
        log.warning("%s: pausing %g s after each batch encoded (a test setting)", PACE_ENV, pace)

    def tick() -> None:
        check_stop(should_stop, "encoding the data")
        if progress is not None:
            progress(done[0], done[1])

    try:
        for batch, size in _batches(docs):
            tick()
            future = worker.submit(batch)
            if pending is not None:
                _write(*pending, route, tick, done)
                _pause(pace, tick)
            pending = (batch, size, future)
        if pending is not None:
            _write(*pending, route, tick, done)
    finally:
        worker.close()


def _pause(seconds: float, tick: Callable[[], None]) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, STOP_POLL_S))
        tick()


class _Worker:
    """One daemon thread that encodes the batches handed to it, in order."""

    def __init__(self, tokenizer: RunTokenizer) -> None:
        self.tokenizer = tokenizer
        self.jobs: queue.SimpleQueue[tuple[list[Document], Future[list[np.ndarray]]] | None] = (
            queue.SimpleQueue()
        )
        threading.Thread(target=self._run, name="encode", daemon=True).start()

    def submit(self, batch: list[Document]) -> Future[list[np.ndarray]]:
        future: Future[list[np.ndarray]] = Future()
        self.jobs.put((batch, future))
        return future

    def close(self) -> None:
        self.jobs.put(None)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            batch, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(_encode(self.tokenizer, batch))
            except BaseException as e:
                future.set_exception(e)


def _write(
    batch: list[Document],
    size: int,
    future: Future[list[np.ndarray]],
    route: Callable[[str], TokenWriter],
    tick: Callable[[], None],
    done: list[int],
) -> None:
    """Wait for a batch's ids (ticking meanwhile: stop requests, progress) and write them."""
    while True:
        try:
            encoded = future.result(timeout=STOP_POLL_S)
            break
        except TimeoutError:
            tick()
    for (doc_id, _), ids in zip(batch, encoded, strict=True):
        route(doc_id).add(ids)
    done[0] += size
    done[1] += len(batch)
    tick()


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


@dataclass(frozen=True)
class Written:
    """A cache entry as `write_arm` wrote it: each file's (path, size, sha256), in the order
    written, and the document counts (None without a held-out split)."""

    files: list[tuple[Path, int, str]]
    documents: int
    documents_held_out: int | None


def write_arm(
    cache: Path,
    identity: str,
    docs: Iterable[Document],
    tokenizer: RunTokenizer,
    fraction: float | None,
    should_stop: Stop = None,
    progress: Progress | None = None,
    *,
    arm: str = "?",
) -> Written:
    """Encode an arm's documents into the cache under `identity`: with a held-out `fraction`, the
    held-out tokens, the document counts and the training tokens; without one, the training
    tokens alone. The files grow under partial names, saved every `partial.SAVE_EVERY_S` and when
    a stop interrupts the encoding: the next call continues from there (`arm` names the arm in
    what it logs), ending in the same files. Anything else that ends the write removes them; an
    OSError names the cache directory."""
    train_path, held_path = split_paths(cache, identity, tokenizer.suffix)
    paths = [train_path, held_path] if fraction else [train_path]
    kept = partial.Partial(cache, identity, tokenizer, paths)
    writers: list[TokenWriter] = []
    try:
        prior = kept.load(should_stop)
        for i, p in enumerate(paths):
            prefix = prior.prefixes[i] if prior is not None else None
            writers.append(TokenWriter(p, tokenizer, partial.partial_path(p), prefix))
        docs, report = _continued(docs, prior, kept, writers, should_stop, progress, arm)

        def route(doc_id: str) -> TokenWriter:
            if fraction and heldout.is_held_out(doc_id, fraction):
                return writers[1]
            return writers[0]

        encode_documents(docs, tokenizer, route, should_stop, report)
        kept.discard(files=False)
        return _commit(cache, identity, writers)
    except InterruptedError:
        # A stop is no failure of the cache: what is encoded stays for the next start.
        _keep(kept, writers, len(paths))
        raise
    except BaseException as e:
        for w in writers:
            w.abort()
        with contextlib.suppress(OSError):
            kept.discard(files=True)
        if isinstance(e, OSError):
            why = f"cannot write the token cache in {cache}: {e.strerror or e}"
            raise (OSError(e.errno, why) if e.errno else OSError(why)) from None
        raise


def _continued(
    docs: Iterable[Document],
    prior: partial.Kept | None,
    kept: partial.Partial,
    writers: list[TokenWriter],
    should_stop: Stop,
    progress: Progress | None,
    arm: str,
) -> tuple[Iterable[Document], Progress]:
    """The documents left to encode (those an earlier start encoded, skipped), and the encoder's
    progress callback: it saves the encoding every `partial.SAVE_EVERY_S` and reports the arm's
    progress, the skipped documents included."""
    skipped = (0, 0)
    if prior is not None:
        t0 = time.perf_counter()
        docs, skipped = _skip(docs, prior.documents, should_stop)
        log.info(
            "arm %s: continuing the encoding a stopped start left in %s: its first %s documents "
            "(%.1f MB of text, %.1f MB of tokens) were encoded already and are not encoded again "
            "(skipped in %.1f s)",
            arm,
            kept.cache,
            f"{prior.documents:,}",
            skipped[0] / 1e6,
            prior.token_bytes / 1e6,
            time.perf_counter() - t0,
        )
    saved = time.monotonic()

    def report(done_bytes: int, documents: int) -> None:
        nonlocal saved
        if time.monotonic() - saved >= partial.SAVE_EVERY_S:
            kept.save(list(writers))
            saved = time.monotonic()
        if progress is not None:
            progress(done_bytes + skipped[0], documents + skipped[1])

    return docs, report


def _skip(
    docs: Iterable[Document], count: int, should_stop: Stop
) -> tuple[Iterator[Document], tuple[int, int]]:
    """`docs` after their first `count`, read but not encoded; (their bytes, `count`)."""
    it = iter(docs)
    size = 0
    for i in range(count):
        if i % 1024 == 0:
            check_stop(should_stop, "skipping the documents encoded already")
        doc = next(it, None)
        if doc is None:
            raise DataError(
                f"the arm has {i:,} documents, fewer than the {count:,} an earlier encoding "
                "recorded: the record belongs to other data"
            )
        size += len(doc[1])
    return it, (size, count)


def _keep(kept: partial.Partial, writers: list[TokenWriter], expected: int) -> None:
    """Save what a stopped encoding wrote, for the next start; a save that fails (a full disk)
    removes it instead: it begins again."""
    try:
        if len(writers) == expected and sum(w.documents for w in writers) > 0:
            kept.save(list(writers))
    except OSError as e:
        log.warning("cannot keep the encoding in %s for the next start (%s)", kept.cache, e)
        for w in writers:
            w.abort()
        with contextlib.suppress(OSError):
            kept.discard(files=True)
    finally:
        for w in writers:
            w.close()


def _commit(cache: Path, identity: str, writers: list[TokenWriter]) -> Written:
    """Put a finished encoding's files in place: the held-out tokens and the document counts
    first, the training tokens last."""
    train = writers[0]
    held = writers[1] if len(writers) > 1 else None
    files = []
    if held is not None:
        held.commit()
        counts = json.dumps([train.documents + held.documents, held.documents]).encode()
        atomic_write_bytes(counts_path(cache, identity), counts)
        files.append((held.path, held.size, held.sha256.hexdigest()))
        files.append((counts_path(cache, identity), len(counts), _sha256(counts)))
    train.commit()
    files.append((train.path, train.size, train.sha256.hexdigest()))
    fsync_dir(cache)
    return Written(
        files,
        train.documents + (held.documents if held else 0),
        held.documents if held else None,
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
