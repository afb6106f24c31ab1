"""Token files read while a run lives: reads that a file changed under the run cannot crash, and
the check that notices the change.

A run reads its token files (a `tokens` arm's file, the cache's encoded arms) for days. Someone may
truncate or rewrite one meanwhile: a new run of nanoGPT's `prepare.py` over `train.bin`, a copy onto
it. Through a memory map, a read past the new end of a truncated file is SIGBUS, which kills the
process with no line logged and no checkpoint; ids rewritten in place reach the embedding as they
are, and one at or above the vocabulary is an IndexError (on a GPU, a device assert). So:

- `TokenFile` reads by `pread` into memory of its own (copy-on-read), never through a map: a
  short read is an error naming the file, never a signal. Every read checks the open file's size
  and modification time before and after it, and the ids it returns against the vocabulary;
- `DataWatch.changed` compares every token file with what the run opened: the open file's size
  and modification time (truncated, rewritten in place) and, for a `tokens` arm's own file, what
  its path names now (replaced, removed: what a restart would read). A few `stat` calls per step
  boundary, so that the loop can stop every rank at one step with a checkpoint of the last step
  trained on the data as it was. The cache's paths are not watched: it replaces an entry only by
  one of the same content, and removes one only to encode it again (tokencache.py), so a run that
  reads the file it opened reads the same ids.

The contents read are the same bytes the map gave, so no trajectory changes. `guard_arm` puts a
loaded arm's memory-mapped arrays behind `TokenFile`s; how a file is opened (its header, dtype,
offset) stays the opener's (arms.py), read here from the map itself.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from andrea.daemon.data import heldout
from andrea.daemon.data.sources import DataError

if TYPE_CHECKING:  # arms.py imports this module
    from andrea.daemon.data.arms import Arm

#: What the trainer tells a person after a token file changed under it (the log and the docs).
RESUME_ADVICE = (
    "put the file back as it was and start again (the run resumes exactly), or start with "
    "--allow-config-change to continue on the changed data (the changed arm starts from its "
    "beginning)"
)


class TokensChanged(DataError):
    """A token file changed under the live run (named, with what changed)."""


@dataclasses.dataclass(frozen=True)
class _Seen:
    """A file as the run opened it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> _Seen:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def change(self, st: os.stat_result) -> str | None:
        """How `st` differs from this file as it was opened; None when it does not."""
        if (st.st_dev, st.st_ino) != (self.dev, self.ino):
            return "replaced by another file"
        if st.st_size != self.size:
            return f"{self.size:,} bytes when the run opened it, {st.st_size:,} now"
        if st.st_mtime_ns != self.mtime_ns:
            return "rewritten in place (its modification time changed)"
        return None


class TokenFile:
    """A read-only 1-D array of token ids in a file, read by `pread`: indexable with integer
    index arrays like the memory map it replaces (what `ArmStream`, `heldout.Spliced` and the
    evaluation need). TokensChanged, naming the file, when the file is not as it was opened."""

    def __init__(
        self, mapped: np.memmap, arm: str, vocab_size: int | None, watch_path: bool = True
    ) -> None:
        """`mapped`: the opener's map of the file (its path, offset, dtype and length are read);
        `vocab_size`: ids at or above it are refused (None: not checked); `watch_path`: `change`
        also reports the path naming another file, or none."""
        if mapped.filename is None:
            raise ValueError("a TokenFile replaces a map of a named file")
        self.path = Path(mapped.filename)
        self.arm = arm
        self.dtype = mapped.dtype
        self.shape = (int(mapped.shape[0]),)
        self._offset = int(mapped.offset)
        self._limit = vocab_size
        self._watch_path = watch_path
        self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        weakref.finalize(self, os.close, self._fd)
        self.seen = _Seen.of(os.fstat(self._fd))

    def __len__(self) -> int:
        return self.shape[0]

    def describe(self, what: str) -> str:
        return f"arm {self.arm!r}: token file {self.path} changed under the run: {what}"

    def change(self) -> str | None:
        """How the file differs from the one the run opened: the open one, or at its path."""
        if (what := self.seen.change(os.fstat(self._fd))) is not None or not self._watch_path:
            return what
        try:
            return self.seen.change(os.stat(self.path))
        except FileNotFoundError:
            return "removed"

    def _check_open(self) -> None:
        if (what := self.seen.change(os.fstat(self._fd))) is not None:
            raise TokensChanged(self.describe(what))

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        """The whole file's ids (what `np.asarray` asks for), in one read."""
        whole = self[slice(None)]
        return whole if dtype is None else whole.astype(dtype)

    def __getitem__(self, index: np.ndarray | slice | int) -> np.ndarray:
        if isinstance(index, slice):
            index = np.arange(*index.indices(self.shape[0]), dtype=np.int64)
        idx = np.asarray(index, dtype=np.int64)
        flat = idx.ravel()
        out = np.empty(flat.size, dtype=self.dtype)
        if flat.size == 0:
            return out.reshape(idx.shape)
        if int(flat.min()) < 0 or int(flat.max()) >= self.shape[0]:
            raise IndexError(f"token index out of range for {self.path} ({self.shape[0]} ids)")
        # One read per run of consecutive indices: a batch's rows are such runs.
        breaks = (np.flatnonzero(np.diff(flat) != 1) + 1).tolist()
        starts, ends = [0, *breaks], [*breaks, flat.size]
        first = flat[starts].tolist()
        size = self.dtype.itemsize
        self._check_open()
        view = memoryview(out.data).cast("B")  # read straight into `out`
        for s, e, at in zip(starts, ends, first, strict=True):
            want = (e - s) * size
            if os.preadv(self._fd, [view[s * size : e * size]], self._offset + at * size) < want:
                raise TokensChanged(self.describe(f"it ends before token {at + e - s:,}"))
        self._check_open()
        if self._limit is not None and int(out.max()) >= self._limit:
            raise TokensChanged(
                self.describe(
                    f"it holds id {int(out.max()):,}, not below [model] vocab_size {self._limit:,}"
                )
            )
        return out.reshape(idx.shape)


def _guarded(
    tokens: np.ndarray | heldout.Spliced | TokenFile, arm: str, vocab: int | None, path: bool
) -> np.ndarray | heldout.Spliced | TokenFile:
    if isinstance(tokens, np.memmap) and tokens.filename is not None:
        return TokenFile(tokens, arm, vocab, path)
    if isinstance(tokens, heldout.Spliced) and isinstance(tokens.base, np.memmap):
        return heldout.Spliced(_guarded(tokens.base, arm, vocab, path), tokens.spans)
    return tokens


def guard_arm(arm: Arm, vocab_size: int | None, watch_path: bool) -> Arm:
    """`arm` with every memory-mapped array (its training tokens, its held-out ones) read by a
    `TokenFile` instead; `watch_path` for a file a person names (a `tokens` arm's), not the
    cache's."""
    tokens = _guarded(arm.tokens, arm.name, vocab_size, watch_path)
    held = None if arm.heldout is None else _guarded(arm.heldout, arm.name, vocab_size, watch_path)
    return dataclasses.replace(arm, tokens=tokens, heldout=held)


def _files(tokens: heldout.TokenArray | heldout.Spliced | None) -> list[TokenFile]:
    if isinstance(tokens, TokenFile):
        return [tokens]
    if isinstance(tokens, heldout.Spliced):
        return _files(tokens.base)
    return []


class DataWatch:
    """The token files of a run's arms, each compared with what the run opened."""

    def __init__(self, arms: list[Arm]) -> None:
        files: dict[Path, TokenFile] = {}
        for arm in arms:
            for f in _files(arm.tokens) + _files(arm.heldout):
                files.setdefault(f.path, f)
        self.files = list(files.values())

    def changed(self) -> str | None:
        """What changed first (the file and arm named), or None while every file is as opened."""
        for f in self.files:
            if (what := f.change()) is not None:
                return f.describe(what)
        return None
