"""The token cache: each encoded arm's files under its identity (daemon/data/arms.py), trusted only once
they are what their encoding recorded.

An entry is ``<identity>.u16`` (the training tokens; ``.u8``/``.u32`` by the tokenizer's size) and,
with a held-out split, ``<identity>.heldout.u16`` and ``<identity>.docs.json``. Its record,
``<identity>.entry.json``, is written last, so its presence says the entry is complete: each file's
size and sha256 (taken as encoding wrote it) and the tokenizer that made the ids. Before a start
maps an entry, every file is checked against the record (the size, then a streamed sha256, about
1 GB/s); an entry that fails (a file missing, cut, emptied or overwritten, a record that does not
parse or names another tokenizer) is logged naming the file, removed, and encoded again, so a
restart cures any damage. An entry without a record (written before records existed, or whose
writer died before its end) is encoded again too.

A write that fails (a full disk) removes its temporary files (``NAME.<pid>.tmp``); those left by a
writer killed mid-write are removed at the next start that finds their entry's lock free (every
temporary is written under that lock: `remove_stale_temporaries`).

Processes that share a cache (the ranks of a torchrun job on a first start, two runs on one
machine) take ``<identity>.lock`` (`entry_lock`): shared to verify an entry, exclusive to repair or
encode it. Without it one rank took another's entry, half written, for a damaged one and removed
it under its writer, and the job failed on its first start.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.daemon.data.encoding import Written, counts_path, split_paths
from andrea.daemon.data.sources import Stop, check_stop
from andrea.daemon.data.tokenizer import RunTokenizer
from andrea.daemon.rundir.boundedio import FileRejected, open_regular, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes, fsync_dir

log = logging.getLogger(__name__)

#: The most an entry's record may hold (a few hundred bytes in practice).
MAX_RECORD_BYTES = 1 << 16
_CHUNK = 1 << 20
#: How often a process waiting for another's lock on an entry looks again (and at a stop request).
_LOCK_POLL_S = 0.1


class CachedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="the file's name in the cache directory")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class EntryRecord(BaseModel):
    """``<identity>.entry.json``: what encoding wrote for one arm."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["andrea-cache-entry/1"] = "andrea-cache-entry/1"
    identity: str
    tokenizer: str = Field(description='"bytes", or the sha256 of the tokenizer file')
    n_vocab: int = Field(ge=1)
    dtype: Literal["uint8", "uint16", "uint32"]
    documents: int = Field(ge=0)
    documents_held_out: int | None = Field(None, ge=0)
    files: list[CachedFile] = Field(min_length=1)


def record_path(cache: Path, identity: str) -> Path:
    return cache / f"{identity}.entry.json"


def entry_paths(cache: Path, identity: str, tokenizer: RunTokenizer) -> list[Path]:
    """Every file an entry may have, its record last."""
    train, held = split_paths(cache, identity, tokenizer.suffix)
    return [train, held, counts_path(cache, identity), record_path(cache, identity)]


def write_record(
    cache: Path, identity: str, tokenizer: RunTokenizer, written: Written
) -> EntryRecord:
    """Record an entry `write_arm` has written: from now on it is trusted once verified."""
    record = EntryRecord(
        identity=identity,
        tokenizer=tokenizer.identity,
        n_vocab=tokenizer.n_vocab,
        dtype=tokenizer.dtype.name,
        documents=written.documents,
        documents_held_out=written.documents_held_out,
        files=[CachedFile(name=p.name, size=n, sha256=h) for p, n, h in written.files],
    )
    try:
        atomic_write_bytes(record_path(cache, identity), record.model_dump_json(indent=1).encode())
    except OSError as e:
        raise _unwritable(cache, e) from None
    return record


def _unwritable(cache: Path, e: OSError) -> OSError:
    return OSError(e.errno, f"cannot write the token cache in {cache}: {e.strerror}")


@contextlib.contextmanager
def entry_lock(
    cache: Path, identity: str, name: str, should_stop: Stop = None, *, exclusive: bool
) -> Iterator[None]:
    """Hold the entry's lock: `exclusive` to repair or encode it, shared to verify it. A process
    that must wait says so once (`name`: the arm) and honours a stop request meanwhile. A cache
    where this user cannot create the lock file is one nobody writes as this user: the shared
    lock is then done without, and the exclusive one fails naming the directory."""
    try:
        fd = os.open(cache / f"{identity}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if exclusive:
            raise _unwritable(cache, e) from None
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield
        return
    # A shared waiter waits for an encoding; an exclusive one may also wait for readers.
    doing = "encoding or verifying" if exclusive else "encoding"
    try:
        said = False
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not said:
                    log.info(
                        "arm %s: another process is %s it into %s; waiting", name, doing, cache
                    )
                    said = True
                check_stop(should_stop, "waiting for the token cache")
                time.sleep(_LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def verified(
    cache: Path,
    identity: str,
    tokenizer: RunTokenizer,
    should_stop: Stop = None,
    repair: bool = True,
) -> EntryRecord | None:
    """The record of the entry `identity` once each of its files matches it; None when there is
    no complete entry, or a damaged one (with `repair`, whose files are then removed, and the
    damage logged naming the file): the caller encodes the arm again. Repair only under the
    entry's exclusive lock (`entry_lock`)."""
    if not any(p.exists() for p in entry_paths(cache, identity, tokenizer)):
        return None
    damage = _damage(cache, identity, tokenizer, should_stop)
    if damage is None:
        return _read_record(cache, identity)
    if repair:
        log.warning("token cache: %s; removing the entry and encoding the arm again", damage)
        remove(cache, identity, tokenizer)
    return None


def _read_record(cache: Path, identity: str) -> EntryRecord:
    raw = read_bounded(record_path(cache, identity), MAX_RECORD_BYTES)
    return EntryRecord.model_validate_json(raw)


def _damage(cache: Path, identity: str, tokenizer: RunTokenizer, should_stop: Stop) -> str | None:
    """What is wrong with the entry, naming the file; None when nothing is."""
    path = record_path(cache, identity)
    try:
        record = _read_record(cache, identity)
    except FileNotFoundError:
        return f"{path} is missing (an entry written before records existed, or left unfinished)"
    except (OSError, FileRejected, ValidationError) as e:
        return f"{path} is damaged ({str(e).splitlines()[0]})"
    if (record.identity, record.tokenizer, record.n_vocab, record.dtype) != (
        identity,
        tokenizer.identity,
        tokenizer.n_vocab,
        tokenizer.dtype.name,
    ):
        return f"{path} records another entry or tokenizer"
    expected = _names(cache, identity, tokenizer, record.documents_held_out is not None)
    if {f.name for f in record.files} != expected:
        return f"{path} lists other files than the entry's ({', '.join(sorted(expected))})"
    for f in record.files:
        wrong = _file_damage(cache / f.name, f, should_stop)
        if wrong is not None:
            return wrong
    return None


def _names(cache: Path, identity: str, tokenizer: RunTokenizer, split: bool) -> set[str]:
    train, held = split_paths(cache, identity, tokenizer.suffix)
    return {train.name, held.name, counts_path(cache, identity).name} if split else {train.name}


def _file_damage(path: Path, expected: CachedFile, should_stop: Stop) -> str | None:
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return f"{path} is missing"
    except (OSError, FileRejected) as e:
        return f"{path} cannot be read ({e})"
    try:
        size = os.fstat(fd).st_size
        if size != expected.size:
            return f"{path} holds {size:,} bytes, its encoding wrote {expected.size:,}"
        sha = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            check_stop(should_stop, "verifying the token cache")
            sha.update(chunk)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)
    if sha.hexdigest() != expected.sha256:
        return f"{path} is not what its encoding wrote (sha256 differs)"
    return None


def remove(cache: Path, identity: str, tokenizer: RunTokenizer) -> None:
    """Remove an entry, its record first (so that no half-removed entry looks complete)."""
    for p in reversed(entry_paths(cache, identity, tokenizer)):
        p.unlink(missing_ok=True)
    fsync_dir(cache)


def remove_stale_temporaries(cache: Path) -> None:
    """Remove the temporary files (``NAME.<pid>.tmp``) that writers killed mid-write left. Each is
    written under the exclusive lock of the entry its name begins with (``<identity>.lock``,
    `entry_lock`), so one whose lock this process can take at once has no live writer. The pid in
    the name is never judged: a writer in another pid namespace (a container sharing the cache, a
    job's other node) has a pid that means nothing here, and its live temporary would be removed
    under it."""
    for p in sorted(cache.glob("*.tmp")):
        pid = p.name.rsplit(".", 2)[-2] if p.name.count(".") >= 2 else ""
        if not pid.isdigit():
            continue  # not a name this module writes
        stem = p.name.split(".", 1)[0]
        try:
            fd = os.open(cache / f"{stem}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            continue  # a cache this user cannot lock is one this user does not write
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its writer (or a reader of the entry) is alive
        else:
            p.unlink(missing_ok=True)
            log.info("token cache: removed %s, left by a write that did not finish", p)
        finally:
            os.close(fd)  # releases the lock
