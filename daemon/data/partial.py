"""An arm's encoding in progress, kept in the token cache so that a start stopped while it encodes (a
unit's start timeout, ``systemctl restart``, a SIGKILL) continues where it stopped, instead of
beginning again from nothing.

While `write_arm` (daemon/data/encoding.py) encodes, its token files grow under ``FILE.partial``,
names that outlive the process (a pid-named temporary would be removed as stale). Every
`SAVE_EVERY_S` seconds, and when a stop interrupts the encoding, the files are made durable and
``<identity>.partial.json`` records how far they go: the number of the arm's documents encoded (a
prefix of them, in their fixed order), and each file's size and sha256 there.

The next encoding of the same entry (the same identity and tokenizer, so the same documents) checks
each file's recorded prefix (its sha256), cuts off what was written after the record, skips the
documents encoded without encoding them again and appends the others. Every document is encoded on
its own, and what joins two depends only on how many came before: the finished files are byte for
byte those an uninterrupted encoding writes, and the entry's record (daemon/data/tokencache.py) is
taken from them as always. A record that does not match (damaged, another tokenizer, a file cut or
changed) is logged, and the encoding begins again.

Only the holder of the entry's exclusive lock (`tokencache.entry_lock`) reads or writes these files.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.daemon.data.sources import Stop, check_stop
from andrea.daemon.data.tokenizer import RunTokenizer
from andrea.daemon.rundir.boundedio import FileRejected, open_regular, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes, fsync_dir

log = logging.getLogger(__name__)

#: How often an encoding in progress is made durable: what a SIGKILL can cost at most. A stop
#: (SIGTERM, a start timeout) saves at once.
SAVE_EVERY_S = 30.0
#: The most a partial record may hold (a few hundred bytes in practice).
MAX_RECORD_BYTES = 1 << 16
_CHUNK = 1 << 20


class PartFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(description="the finished file's name in the cache directory")
    size: int = Field(ge=0, description="bytes of FILE.partial that hold whole documents")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of those bytes")
    documents: int = Field(ge=0)


class PartialRecord(BaseModel):
    """``<identity>.partial.json``: how far an interrupted encoding of one entry went."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["andrea-cache-partial/1"] = "andrea-cache-partial/1"
    identity: str
    tokenizer: str = Field(description='"bytes", or the sha256 of the tokenizer file')
    n_vocab: int = Field(ge=1)
    dtype: Literal["uint8", "uint16", "uint32"]
    documents: int = Field(ge=0, description="the arm's first documents, encoded")
    files: list[PartFile] = Field(min_length=1)


@dataclass
class Prefix:
    """What a token file holds already: where a resumed writer goes on from."""

    size: int
    documents: int
    sha256: hashlib._Hash


class Growing(Protocol):
    """A token file being written (encoding.TokenWriter), as a save sees it."""

    path: Path
    documents: int
    sha256: hashlib._Hash

    @property
    def size(self) -> int: ...

    def sync(self) -> None: ...


def partial_path(path: Path) -> Path:
    """Where the token file `path` grows until it is complete."""
    return path.with_name(path.name + ".partial")


def record_path(cache: Path, identity: str) -> Path:
    return cache / f"{identity}.partial.json"


@dataclass(frozen=True)
class Kept:
    """The encoding of one entry that an earlier start left: `documents` of the arm's, encoded, and
    each file's prefix (in the order of the entry's paths)."""

    documents: int
    prefixes: list[Prefix]

    @property
    def token_bytes(self) -> int:
        return sum(p.size for p in self.prefixes)


class Partial:
    """The partial files and record of the entry `identity`, whose token files are `paths` (the
    training tokens, then the held-out ones when the arm has a split)."""

    def __init__(
        self, cache: Path, identity: str, tokenizer: RunTokenizer, paths: list[Path]
    ) -> None:
        self.cache = cache
        self.identity = identity
        self.tokenizer = tokenizer
        self.paths = paths
        self.record = record_path(cache, identity)

    def load(self, should_stop: Stop = None) -> Kept | None:
        """What an earlier encoding kept, checked against its record; None when there is nothing
        to continue (a record that does not match is logged and removed: the encoding begins
        again)."""
        try:
            record = PartialRecord.model_validate_json(read_bounded(self.record, MAX_RECORD_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, FileRejected, ValidationError) as e:
            self._unusable(f"{self.record} is damaged ({str(e).splitlines()[0]})")
            return None
        wrong = self._mismatch(record)
        if wrong is not None:
            self._unusable(wrong)
            return None
        if not record.documents:
            return None  # nothing to continue: the files are written again from their start
        prefixes = []
        for path, part in zip(self.paths, record.files, strict=True):
            prefix = _prefix(partial_path(path), part, should_stop)
            if isinstance(prefix, str):
                self._unusable(prefix)
                return None
            prefixes.append(prefix)
        return Kept(record.documents, prefixes)

    def _mismatch(self, record: PartialRecord) -> str | None:
        t = self.tokenizer
        if (record.identity, record.tokenizer, record.n_vocab, record.dtype) != (
            self.identity,
            t.identity,
            t.n_vocab,
            t.dtype.name,
        ):
            return f"{self.record} records another entry or tokenizer"
        if [f.name for f in record.files] != [p.name for p in self.paths]:
            return f"{self.record} lists other files than the entry's"
        if sum(f.documents for f in record.files) != record.documents:
            return f"{self.record} counts its documents inconsistently"
        return None

    def _unusable(self, why: str) -> None:
        log.warning("token cache: %s; encoding the arm from its beginning", why)
        self.discard(files=True)

    def save(self, writers: list[Growing]) -> None:
        """Make what `writers` hold durable and record it (the record last: a record never
        promises more than the files hold)."""
        for w in writers:
            w.sync()
        record = PartialRecord(
            identity=self.identity,
            tokenizer=self.tokenizer.identity,
            n_vocab=self.tokenizer.n_vocab,
            dtype=self.tokenizer.dtype.name,
            documents=sum(w.documents for w in writers),
            files=[
                PartFile(
                    name=w.path.name,
                    size=w.size,
                    sha256=w.sha256.copy().hexdigest(),
                    documents=w.documents,
                )
                for w in writers
            ],
        )
        atomic_write_bytes(self.record, record.model_dump_json(indent=1).encode())

    def discard(self, files: bool) -> None:
        """Forget the encoding in progress: its record, and with `files` its partial files."""
        self.record.unlink(missing_ok=True)
        if files:
            for p in self.paths:
                partial_path(p).unlink(missing_ok=True)
        fsync_dir(self.cache)


def _prefix(path: Path, part: PartFile, should_stop: Stop) -> Prefix | str:
    """The recorded prefix of a partial file, its sha256 checked; what is wrong, naming the file."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return f"{path} is missing"
    except (OSError, FileRejected) as e:
        return f"{path} cannot be read ({e})"
    sha = hashlib.sha256()
    try:
        size = os.fstat(fd).st_size
        if size < part.size:
            return f"{path} holds {size:,} bytes, fewer than the {part.size:,} recorded"
        left = part.size
        while left:
            check_stop(should_stop, "checking the encoding kept in the token cache")
            chunk = os.read(fd, min(_CHUNK, left))
            if not chunk:
                return f"{path} ended before its recorded {part.size:,} bytes"
            sha.update(chunk)
            left -= len(chunk)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e})"
    finally:
        os.close(fd)
    if sha.hexdigest() != part.sha256:
        return f"{path} is not what the encoding recorded (sha256 differs)"
    return Prefix(part.size, part.documents, sha)
