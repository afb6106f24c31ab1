"""The run's ``.loss.json``: one entry per trained step, append-only, crash-safe, plain JSON.

The file is the run's audit trail (see docs/satellite-files.md): it is never truncated, rewritten or
archived, except that :meth:`LossLog.open` repairs a torn tail left by a writer that died mid-append.

Byte grammar (exact; every entry is the compact JSON of one :class:`LossEntry`, fields in model order)::

    file      = "[" [ "\\n" entry *( ",\\n" entry ) ] "\\n]\\n"
    entry     = "{" ... "}"            ; one JSON object on one line: no raw "\\n" (JSON escapes it)

so the empty log is the 4 bytes ``[\\n]\\n`` and a log of two entries is::

    [
    {"step":1,"loss":2.75,...,"batch_sha256":null},
    {"step":2,"loss":"NaN",...,"batch_sha256":null}
    ]

The file always ends with the terminator ``\\n]\\n``. An append writes, at ``size - 3`` (over the old
terminator), ``SEP entry *(",\\n" entry) "\\n]\\n"`` with ``SEP = "\\n"`` for the first entry and ``",\\n"``
after it: one ``pwrite`` at a known offset, O(1) whatever the file size.

Non-finite losses (a NaN loss is a real event) are written as the JSON strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` (the spellings Python's ``float()``, JavaScript's ``Number()`` and pandas'
``astype(float)`` read back); every other number is a plain JSON number, so the file is strict JSON.

Torn tail. The writer may be killed at any byte of an append, which leaves the last complete entry
followed by one of (then possibly a run of NUL bytes, which some file systems expose after a power loss)::

    ""  "\\n"  "\\n]"  "\\n]\\n"                   a prefix of the terminator
    ","  ",\\n"  ",]\\n"  ",\\n\\n"  "\\n{\\n"         the start of an append over the old terminator
    ",\\n{..."                                  a partial entry line (no "\\n", not a complete object)

:meth:`LossLog.open` finds the last complete entry by scanning backwards from the end (reading only the
tail), truncates after it and rewrites the terminator. No complete entry is ever dropped: a prefix of an
entry line can never be a complete JSON object, so "complete" is decidable from the tail alone. A file
whose first entry is torn (or a zero-length file) becomes the empty log. Anything else raises
:class:`LossLogCorrupt` naming the byte offset and leaves the file untouched: garbage anywhere, a
reformatted or hand-edited file, a complete last line that is not a valid entry. (Opening checks the
JSON, the layout and the field names of every entry but fully validates only the last one; a bad value
inside an earlier entry is reported by :func:`read_entries` and :func:`read_curve`.)

Durability. :meth:`LossLog.append` writes without fsync: once it returns, the entry survives the death of
the writer process (kill -9), but not a power loss. :meth:`LossLog.sync` fsyncs: an entry that was synced
survives kill -9 and power loss (on storage that honours fsync). The proxy acknowledges an entry to the
trainer only after ``sync()``; :meth:`LossLog.append_many` + one ``sync()`` is the efficient path.

Exactly once. Each (segment, step) pair is written at most once: appending a pair already present is a
no-op that returns False, so a message resent after a restart is harmless.

One writer. The writer holds an exclusive ``flock`` on the file while open; a second writer is refused
with :class:`LossLogLocked`. Readers (:func:`read_entries`, :func:`read_curve`, :func:`last_entry`) take no
lock, never modify the file and tolerate a torn tail, so they can run while a writer appends.

Readers. :func:`read_entries` returns every entry as a :class:`LossEntry`, in file order. :func:`read_curve`
returns the canonical curve (:func:`canonical_curve`) as numpy columns, checked exactly as the model checks
them but without building a model per entry: what plotting or printing a whole curve needs, in about 60%
of the time (at 200,000 entries; the JSON parse is half of what is left). :func:`last_entry` reads only
the end of the file.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import logging
import operator
import os
import stat
from collections.abc import Callable, Iterable, Iterator, KeysView, Sized
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, partial
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, ClassVar, Self, TypeVar

import numpy as np
import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

from andrea.daemon.rundir.boundedio import LINK_REFUSED, FileRejected, open_regular
from andrea.daemon.rundir.durable import fsync_dir
from andrea.daemon.runtime.validation_messages import first_problem
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lossentry import MAX_STEP, MAX_TOKENS, LossEntry
from andrea.protocol.lossentry import NON_FINITE_LOSSES as _NON_FINITE

__all__ = [
    "LossCurve",
    "LossEntry",
    "LossLog",
    "LossLogCorrupt",
    "LossLogError",
    "LossLogLocked",
    "canonical_curve",
    "last_entry",
    "read_curve",
    "read_entries",
]

log = logging.getLogger(__name__)

_EMPTY = b"[\n]\n"
_TERM = b"\n]\n"
_SEP = b",\n"
# Every file shape that holds no complete entry yet: a creation or a first append torn at any byte.
_EMPTY_FORMS = frozenset({b"", b"[", b"[\n", b"[\n]", _EMPTY, b"[\n{\n"})
# What may follow the last complete entry: the terminator, or an append cut within its first bytes.
_TAIL_FORMS = (b"\n]\n", b",]\n", b",\n\n", b"\n]", b",\n", b"\n", b",", b"")
_ENTRY_HEAD = b'{"step":'
_HEX_DIGITS = b"0123456789abcdef"
_FIRST_TAIL_READ = 4096
_NUL_SCAN_CHUNK = 1 << 16
#: The longest NUL tail accepted as torn-write debris, and the most entry bytes a log may hold
#: (about 30 million entries): bounds that keep a damaged or hostile file from being allocated.
MAX_NUL_TAIL = 1 << 20
MAX_LOG_BYTES = 8 << 30


_ENTRIES = TypeAdapter(list[LossEntry])


def _key_sets(model: type[BaseModel]) -> tuple[KeysView[str], KeysView[str]]:
    """The fields every entry of `model` has, in model order, and all its fields: those plus the
    ones its JSON leaves out when they have no value (a record's ``heldout``)."""
    fields = model.model_fields
    required = dict.fromkeys(n for n, f in fields.items() if f.exclude_if is None)
    return required.keys(), fields.keys()


_FIELD_NAMES, _ALL_FIELDS = _key_sets(LossEntry)
# What LossEntry takes for each field, in JSON, as whole-column checks for read_curve: the Python types
# (strict: an int is not a bool or a float; a float may be an int; loss strings are decoded before this
# check), the ge= bound of each integer field, and the column type in a LossCurve.
_TYPES: dict[str, set[type]] = {
    "step": {int},
    "loss": {int, float},
    "arm": {str},
    "lr": {int, float},
    "tokens": {int},
    "wall_time": {int, float},
    "segment": {int},
    "phase": {int},
    "batch_sha256": {str, type(None)},
}
_INT_MINIMA = {"step": 1, "tokens": 1, "segment": 1, "phase": 0}
_INT_MAXIMA = {"step": MAX_STEP, "tokens": MAX_TOKENS, "segment": MAX_STEP, "phase": MAX_STEP}
_DTYPES = {
    "step": np.int64,
    "loss": np.float64,
    "arm": object,
    "lr": np.float64,
    "tokens": np.int64,
    "wall_time": np.float64,
    "segment": np.int64,
    "phase": np.int64,
    "batch_sha256": object,
}
_S = TypeVar("_S", bound=Sized)
#: What a log of this discipline holds: a class's `entry_type` says which (checked on append).
Record = LossEntry | EvalEntry


class LossLogError(Exception):
    """Base class of the errors raised by this module."""


class LossLogCorrupt(LossLogError):
    """The file is not a (possibly torn) loss log; nothing was modified."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: {reason} at byte offset {offset}; the file was not modified")
        self.path = path
        self.offset = offset
        self.reason = reason


class LossLogLocked(LossLogError):
    """Another writer holds the file open."""


@dataclass(frozen=True)
class _Tail:
    end: int  # offset where the terminator belongs: just past the last complete entry, 1 when there is none
    last: Any  # the model of the last complete entry, or None
    clean: bool  # the file is exactly file[:end] + terminator: nothing to repair


def _scan_tail(
    path: Path, read: Callable[[int, int], bytes], size: int, model: type[BaseModel] = LossEntry
) -> _Tail:
    """Find the last complete entry by reading backwards from the end: O(size of the torn tail)."""
    want = _FIRST_TAIL_READ
    while True:
        base = max(0, size - want)
        tail = _analyse_tail(path, read(base, size - base), base, model)
        if tail is not None:
            return tail
        want *= 4


def _analyse_tail(path: Path, data: bytes, base: int, model: type[BaseModel]) -> _Tail | None:
    """Classify the end of a log; ``data`` is the file from offset ``base`` on. None: read further back."""
    text = data.rstrip(b"\0")
    if base == 0 and text in _EMPTY_FORMS:
        return _Tail(end=1, last=None, clean=data == _EMPTY)
    line_start = text.rfind(b"\n") + 1
    if base > 0 and line_start < 3:
        return None

    # Either the last entry is complete and only (part of) a terminator or separator follows it ...
    end = -1
    for form in _TAIL_FORMS:
        cut = len(text) - len(form)
        if text.endswith(form) and text[cut - 1 : cut] == b"}":
            end = cut
            break
    entry = None
    if end >= 0:
        entry_start = text.rfind(b"\n", 0, end) + 1
        if base > 0 and entry_start < 3:
            return None
        entry = _complete_entry(path, text[entry_start:end], base + entry_start, model)
    if entry is None:
        # ... or the file ends inside an entry line: the torn start of the next entry.
        last_line = text[line_start:]
        plausible = last_line.startswith(_ENTRY_HEAD) or (
            last_line != b"" and _ENTRY_HEAD.startswith(last_line)
        )
        if not plausible or b"\0" in last_line:
            raise LossLogCorrupt(
                path, base + line_start, "unrecognised bytes at the end of the log"
            )
        if base + line_start == 2 and text[:2] == b"[\n":
            return _Tail(end=1, last=None, clean=False)
        end = line_start - len(_SEP)
        if text[end:line_start] != _SEP:
            raise LossLogCorrupt(path, base + line_start, "torn entry not preceded by ',\\n'")
        entry_start = text.rfind(b"\n", 0, end) + 1
        if base > 0 and entry_start < 3:
            return None
        entry = _complete_entry(path, text[entry_start:end], base + entry_start, model)
        if entry is None:
            raise LossLogCorrupt(path, base + entry_start, f"not a complete {model.__name__}")

    before = text[entry_start - 2 : entry_start]
    if before != _SEP and not (before == b"[\n" and base + entry_start == 2):
        raise LossLogCorrupt(
            path, max(0, base + entry_start - 2), "entry not preceded by '[\\n' or ',\\n'"
        )
    return _Tail(end=base + end, last=entry, clean=data[end:] == _TERM)


def _complete_entry(path: Path, line: bytes, offset: int, model: type[BaseModel]) -> Any:
    """The entry on ``line``; None if ``line`` is not a complete JSON object (a torn prefix)."""
    try:
        json.loads(line)
    except ValueError:
        return None
    # A prefix of an entry line is never a complete object, so a complete object that is not a valid
    # entry was written by someone else: refuse rather than drop it.
    try:
        return model.model_validate_json(line)
    except ValidationError as exc:
        raise LossLogCorrupt(
            path, offset, f"invalid {model.__name__} ({first_problem(exc)})"
        ) from None


def _parse_body(
    path: Path,
    buf: bytes,
    tail: _Tail,
    parse: Callable[[bytes], _S],
    model: type[BaseModel] = LossEntry,
) -> _S | list[Any]:
    """``parse`` the entries before ``tail.end``, checking the layout; any deviation names its byte offset.

    ``parse`` returns one item per entry (``len`` is all this needs); a log with no entry gives ``[]``.
    """
    if tail.last is None:
        return []
    # A clean file is already the JSON document: parse it in place rather than copy 40 MB.
    doc = buf if tail.clean else buf[: tail.end] + _TERM
    items: _S | None
    try:
        items = parse(doc)
    except (
        ValueError
    ):  # invalid JSON or a failed validation (pydantic's ValidationError is a ValueError)
        items = None
    # Valid JSON is not enough: the tail logic relies on one entry per line, each but the last ending
    # "},". With n entries that is n - 1 separators "},\n" and n + 2 newlines in all.
    n = -3 if items is None else len(items)
    if (
        items is None
        or not doc.startswith(b"[\n")
        or doc.count(b"\n") != n + 2
        or doc.count(b"},\n") != n - 1
    ):
        offset, reason = _first_bad_line(buf, tail.end, model)
        raise LossLogCorrupt(path, offset, reason)
    return items


def _field_columns(
    doc: bytes,
    names: Iterable[str],
    fields: KeysView[str] = _FIELD_NAMES,
    everything: KeysView[str] = _ALL_FIELDS,
) -> dict[str, list[Any]]:
    """Parse ``doc`` as strict JSON (no NaN literal), check that every entry is an object with the
    ``fields`` every entry has and no others than ``everything`` (ValueError otherwise) and return
    the values of the fields ``names``, in file order.

    Written with map() so that no Python bytecode runs per entry: a plain loop costs as much as the JSON
    parse itself. Each pass walks 200,000 objects scattered in memory, so the fields are checked in one
    pass (comparing key sets) and only the columns asked for are taken: counting keys and taking every
    column instead made :meth:`LossLog.open`, which wants two, 100-200 ms slower in the benchmark. The
    default string cache measured fastest: cache_strings="keys" was no faster (cached, the few arm names
    are shared rather than made 200,000 times), "none" took half as long again.
    """
    items = pydantic_core.from_json(doc, allow_inf_nan=False)
    try:
        names_ok = all(map(fields.__eq__, map(dict.keys, items)))
        if not names_ok and len(everything) > len(fields):
            # Some entries carry an optional field: each must hold the required ones and no more
            # than all of them (still no bytecode per entry).
            names_ok = all(map(operator.ge, map(dict.keys, items), repeat(fields))) and all(
                map(operator.le, map(dict.keys, items), repeat(everything))
            )
    except TypeError:  # an item that is not an object
        names_ok = False
    if not names_ok:
        raise ValueError("an entry does not have exactly the entry model's fields")
    return {name: list(map(itemgetter(name), items)) for name in names}


def _index_keys(
    doc: bytes, fields: KeysView[str] = _FIELD_NAMES, everything: KeysView[str] = _ALL_FIELDS
) -> list[tuple[int, int]]:
    """(segment, step) of every entry, checking strict JSON, the exact field names and those two fields.

    The writer needs no more, and validating 200,000 models would double the time of an open, so the
    other fields are left to :func:`read_entries` and :func:`read_curve`.
    """
    columns = _field_columns(doc, ("segment", "step"), fields, everything)
    segments, steps = columns["segment"], columns["step"]
    for values in (segments, steps):
        if set(map(type, values)) != {int} or min(values) < 1:
            raise ValueError("segment and step must be integers >= 1")
    return list(zip(segments, steps))


def _first_bad_line(buf: bytes, end: int, model: type[BaseModel]) -> tuple[int, str]:
    """Locate the first deviation from the grammar in ``buf[:end]`` (the slow path, for the error message)."""
    if not buf.startswith(b"[\n"):
        return 0, "the log does not start with '[\\n'"
    pos = 2
    while pos < end:
        nl = buf.find(b"\n", pos, end)
        line = buf[pos : end if nl < 0 else nl]
        if nl >= 0:
            if not line.endswith(b"},"):
                return pos, "entry line does not end with '},'"
            line = line[:-1]
        try:
            model.model_validate_json(line)
        except ValidationError as exc:
            return pos, f"invalid {model.__name__} ({first_problem(exc)})"
        if nl < 0:
            break
        pos = nl + 1
    return 2, "entries do not follow the one-entry-per-line layout"


def _check_regular(path: Path, fd: int) -> int:
    """The size of the open file, which must be a regular file (not /dev/zero, a FIFO, ...)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise LossLogCorrupt(path, 0, "not a regular file")
    return st.st_size


def _open_reader(path: Path) -> int:
    """A descriptor of the log for a reader: a regular file where it lies, never through a link
    (a tool run by root must not read what a planted link points at)."""
    try:
        return open_regular(path)
    except FileRejected as e:
        raise LossLogCorrupt(path, 0, str(e).removeprefix(f"{path}: ")) from None


def _content_size(path: Path, fd: int, size: int) -> int:
    """Where the file's content ends: the size without a trailing run of NUL bytes. A power loss
    leaves at most a few blocks of them; a longer run (a 64 GiB sparse tail, say) is refused before
    anything is allocated, and so is content beyond MAX_LOG_BYTES."""
    end = size
    while end > 0:
        n = min(_NUL_SCAN_CHUNK, end)
        kept = len(os.pread(fd, n, end - n).rstrip(b"\0"))
        if kept:
            end = end - n + kept
            break
        end -= n
        if size - end > MAX_NUL_TAIL:
            raise LossLogCorrupt(
                path,
                end,
                f"more than {MAX_NUL_TAIL:,} NUL bytes at the end ({size:,}-byte file), more than a"
                f" torn write leaves; if the entries before them are intact, `truncate -s` the"
                f" file to its last entry",
            )
    if end > MAX_LOG_BYTES:
        raise LossLogCorrupt(
            path, MAX_LOG_BYTES, f"{end:,} bytes of entries, more than a log holds"
        )
    return end


def _read_all(fd: int, size: int) -> bytes:
    chunks = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


class LossLog:
    """The single writer of a ``.loss.json``. Create with :meth:`open`; use as a context manager.

    Not thread-safe: one thread appends. ``len(log)`` is the number of entries; ``(segment, step) in log``
    says whether that pair is present.

    The same file discipline serves other per-step records keyed by (segment, step): a subclass sets
    ``entry_type`` to a model whose first field is ``step`` and that has a ``segment`` field.
    """

    entry_type: ClassVar[type[BaseModel]] = LossEntry

    def __init__(
        self,
        path: Path,
        fd: int,
        end: int,
        keys: set[tuple[int, int]],
        count: int,
        last: Record | None,
    ) -> None:
        self._path = path
        self._fd: int | None = fd
        self._end = end
        self._keys = keys
        self._count = count
        self._last = last
        self._broken = False

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Self:
        """Open (creating if absent) the log for appending, repairing a torn tail.

        Reads the whole file once to build the (segment, step) index, checking that it is strict JSON in
        the one-entry-per-line layout with the exact fields (the last entry fully validated); the other
        fields of earlier entries are validated by :func:`read_entries`. Raises :class:`LossLogLocked` if
        another writer has it open and :class:`LossLogCorrupt` if it is not a (possibly torn) loss log; in
        both cases the file is not modified.
        """
        path = Path(path)
        try:
            # Never through a link: a daemon would append to whatever it points at.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LossLogCorrupt(
                    path, 0, f"not a regular file (a symbolic link; {LINK_REFUSED})"
                ) from None
            if e.errno not in (errno.EISDIR, errno.ENXIO):  # a directory, a socket
                raise
            raise LossLogCorrupt(path, 0, "not a regular file") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LossLogLocked(
                    f"{path} is already open for writing (flock held by another writer)"
                ) from None
            size = _check_regular(path, fd)
            buf = _read_all(fd, _content_size(path, fd, size))
            model = cls.entry_type
            tail = _scan_tail(path, lambda offset, n: buf[offset : offset + n], len(buf), model)
            required, everything = _key_sets(model)
            index = partial(_index_keys, fields=required, everything=everything)
            listed = _parse_body(path, buf, tail, index, model)
            keys = set(listed)
            if len(keys) != len(listed):
                log.warning(
                    "%s: %d entries repeat a (segment, step) pair; canonical_curve keeps the last",
                    path,
                    len(listed) - len(keys),
                )
            if not tail.clean or len(buf) != size:
                _repair(path, fd, tail, size, len(listed))
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, tail.end, keys, len(listed), tail.last)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def last(self) -> Record | None:
        """The last entry in file order, or None for an empty log."""
        return self._last

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def append(self, entry: Record) -> bool:
        """Append one entry (no fsync); False, writing nothing, if its (segment, step) is already present."""
        return self.append_many((entry,)) == 1

    def append_many(self, entries: Iterable[Record]) -> int:
        """Append entries in one write (no fsync), skipping (segment, step) pairs already present.

        Returns the number of entries written. If the write fails (a full disk) it is undone at once: the
        file is cut back to its last complete entry and its terminator (the cut frees what the write took,
        so this fits on a full disk). The log then refuses further use: reopen it (which repairs the tail,
        should the undo have failed too).
        """
        fd = self._usable_fd()
        lines: list[bytes] = []
        new_keys: set[tuple[int, int]] = set()
        last = self._last
        for entry in entries:
            if not isinstance(entry, self.entry_type):
                raise TypeError(f"expected {self.entry_type.__name__}, got {type(entry).__name__}")
            key = (entry.segment, entry.step)
            if key in self._keys or key in new_keys:
                continue
            new_keys.add(key)
            lines.append(entry.model_dump_json().encode())
            last = entry
        if not lines:
            return 0
        data = (_SEP if self._count else b"\n") + _SEP.join(lines) + _TERM
        try:
            _pwrite_all(fd, data, self._end)
        except BaseException:
            self._broken = True
            self._undo_append(fd)
            raise
        self._end += len(data) - len(_TERM)
        self._keys |= new_keys
        self._count += len(lines)
        self._last = last
        return len(lines)

    def _undo_append(self, fd: int) -> None:
        """Cut a failed append off: the file ends, as before it, with the terminator after the last
        complete entry (the terminator is what the append began by overwriting)."""
        try:
            os.ftruncate(fd, self._end)
            _pwrite_all(fd, _TERM, self._end)
            os.fsync(fd)
        except OSError as e:
            log.error(
                "%s: a failed append left a torn tail after byte %d, which could not be cut off "
                "now (%s); the next open repairs it",
                self._path,
                self._end,
                e,
            )
        else:
            log.warning(
                "%s: a failed append was undone; the log ends with its last complete entry",
                self._path,
            )

    def sync(self) -> None:
        """fsync: every entry appended so far survives kill -9 and power loss once this returns."""
        os.fsync(self._usable_fd())

    def close(self) -> None:
        """Sync (unless a write failed) and release the file and its lock. Idempotent."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if not self._broken:
                os.fsync(fd)
        finally:
            os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _usable_fd(self) -> int:
        if self._fd is None:
            raise LossLogError(f"{self._path}: the log is closed")
        if self._broken:
            raise LossLogError(f"{self._path}: a write failed; reopen the log to repair its tail")
        return self._fd


def _repair(path: Path, fd: int, tail: _Tail, size: int, count: int) -> None:
    # Truncate first, fsync, then write the terminator: a crash in between leaves "...}" or a prefix of
    # the terminator, both torn tails the next open repairs again; the reverse order could leave a
    # terminator followed by stale bytes, which is not.
    keep, fill = (0, _EMPTY) if tail.last is None else (tail.end, _TERM)
    os.ftruncate(fd, keep)
    os.fsync(fd)
    _pwrite_all(fd, fill, keep)
    os.fsync(fd)
    if size == 0:
        fsync_dir(path.parent)  # a new file: make its directory entry durable too
        log.info("%s: created an empty loss log", path)
    else:
        log.warning(
            "%s: repaired a torn tail: dropped %d bytes after byte %d, kept %d complete entries",
            path,
            size - tail.end,
            tail.end,
            count,
        )


@contextmanager
def _gc_paused() -> Iterator[None]:
    # Building 200,000 models sets off the cyclic collector again and again, each pass walking every
    # model made so far (about 40% of read_entries). Models hold no cycles, so pausing it loses nothing.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@cache
def _list_adapter(model: type[BaseModel]) -> TypeAdapter[list[Any]]:
    # A list of a class known only at run time, which a static type cannot name.
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def read_entries(path: str | os.PathLike[str], model: type[BaseModel] = LossEntry) -> list[Any]:
    """All complete entries (of ``model``, by default :class:`LossEntry`) in file order. Tolerates a
    torn tail and never modifies the file.

    Raises FileNotFoundError if there is no log, :class:`LossLogCorrupt` if it is not such a log.
    """
    path = Path(path)
    buf = _read_content(path)
    tail = _scan_tail(path, lambda offset, n: buf[offset : offset + n], len(buf), model)
    with _gc_paused():
        return _parse_body(path, buf, tail, _list_adapter(model).validate_json, model)


def last_entry(path: str | os.PathLike[str], model: type[BaseModel] = LossEntry) -> Any:
    """The last complete entry (None for an empty log), reading only the end of the file: O(1).

    Tolerates a torn tail and never modifies the file; raises FileNotFoundError if there is no log.
    """
    path = Path(path)
    fd = _open_reader(path)
    try:
        size = _content_size(path, fd, _check_regular(path, fd))
        return _scan_tail(path, lambda offset, n: os.pread(fd, n, offset), size, model).last
    finally:
        os.close(fd)


def _read_content(path: Path) -> bytes:
    """The file's content without a NUL tail, read only once it is known to be a regular file of
    bounded size (readers never modify the file)."""
    fd = _open_reader(path)
    try:
        return _read_all(fd, _content_size(path, fd, _check_regular(path, fd)))
    finally:
        os.close(fd)


@dataclass(frozen=True, eq=False)
class LossCurve:
    """Loss-log entries as columns, one numpy array per :class:`LossEntry` field: row ``i`` is one entry.

    :func:`read_curve` returns the canonical curve this way because building 200,000 models costs most of
    a second, and a plot wants arrays anyway; :meth:`entry` builds the model of a row that needs one.
    ``loss`` may be non-finite; ``arm`` (str) and ``batch_sha256`` (str or None) are object arrays.
    """

    step: np.ndarray  # int64
    loss: np.ndarray  # float64
    arm: np.ndarray  # object
    lr: np.ndarray  # float64
    tokens: np.ndarray  # int64
    wall_time: np.ndarray  # float64
    segment: np.ndarray  # int64
    phase: np.ndarray  # int64
    batch_sha256: np.ndarray  # object
    entries_read: int  # complete entries in the file, before canonicalisation

    def __len__(self) -> int:
        return len(self.step)

    def entry(self, i: int) -> LossEntry:
        """Row ``i`` (negative counts from the end) as a model, with plain Python numbers."""
        return LossEntry(**{name: getattr(self, name).item(i) for name in _FIELD_NAMES})


def _curve(columns: dict[str, Any]) -> LossCurve:
    """A LossCurve in file order (not canonical) of the given field columns (lists of equal length)."""
    n = len(columns["step"])
    # fromiter: a third to a half faster than np.array on a list; OverflowError for an integer beyond int64.
    arrays = {
        name: np.fromiter(columns[name], dtype=_DTYPES[name], count=n) for name in _FIELD_NAMES
    }
    return LossCurve(**arrays, entries_read=n)


def _fast_curve(doc: bytes) -> LossCurve:
    """The entries of ``doc`` as columns, checked as :class:`LossEntry` checks them, without building a
    model: a set of types and a min per column instead of a validation per entry. ValueError or
    OverflowError if any check fails (the caller then validates models, which name the bad entry).
    """
    columns = _field_columns(doc, _FIELD_NAMES)
    losses = columns["loss"]
    if str in set(map(type, losses)):
        # _decode_loss's three spellings, with dict.get(value, value): any other string stays a string and
        # fails the type check below. Only a hashable value can be looked up.
        if not set(map(type, losses)) <= {int, float, str}:
            raise ValueError("loss must be a number or a non-finite spelling")
        columns["loss"] = list(map(_NON_FINITE.get, losses, losses))
    for name, allowed in _TYPES.items():
        if not set(map(type, columns[name])) <= allowed:
            raise ValueError(f"{name}: not a JSON value of the type LossEntry takes")
    if not all(columns["arm"]):
        raise ValueError("arm must not be empty")
    hashes = columns["batch_sha256"]
    given = list(filter(None, hashes))  # the strings (None and "" dropped)
    # One pass over all hashes together: deleting the lowercase hex digits must leave nothing (a regular
    # expression over the joined hashes takes four times as long).
    if (
        "" in hashes
        or not set(map(len, given)) <= {64}
        or "".join(given).encode().translate(None, _HEX_DIGITS)
    ):
        raise ValueError("batch_sha256 must be null or 64 lowercase hex digits")
    curve = _curve(columns)
    for name, least in _INT_MINIMA.items():
        if getattr(curve, name).min() < least or getattr(curve, name).max() > _INT_MAXIMA[name]:
            raise ValueError(f"{name} must be in {least}..{_INT_MAXIMA[name]}")
    if max(map(len, columns["arm"])) > 64:
        raise ValueError("arm names are at most 64 characters")
    for values in (curve.lr, curve.wall_time):
        if not (np.isfinite(values).all() and values.min() >= 0):
            raise ValueError("lr and wall_time must be finite and >= 0")
    return curve


def _parse_curve(doc: bytes) -> LossCurve | list[LossEntry]:
    """The fast columns, or, when a fast check fails, the models: :func:`read_entries`' own parse, so that
    a bad entry raises exactly what read_entries raises, and a file the fast checks are stricter about (a
    bare NaN literal, which the model's JSON parser takes) still reads."""
    try:
        return _fast_curve(doc)
    except (ValueError, OverflowError):
        with _gc_paused():
            return _ENTRIES.validate_json(doc)


def read_columns(path: str | os.PathLike[str]) -> LossCurve:
    """Every complete entry, in file order, as columns (:func:`read_curve` before it keeps one entry
    per step). Same checks, errors and torn-tail tolerance as :func:`read_entries`; never modifies
    the file."""
    path = Path(path)
    buf = _read_content(path)
    tail = _scan_tail(path, lambda offset, n: buf[offset : offset + n], len(buf))
    parsed = _parse_body(path, buf, tail, _parse_curve)
    return (
        parsed
        if isinstance(parsed, LossCurve)
        else _curve({name: [getattr(e, name) for e in parsed] for name in _FIELD_NAMES})
    )


def read_curve(path: str | os.PathLike[str]) -> LossCurve:
    """The canonical curve (see :func:`canonical_curve`) as columns, without a model per entry.

    Same checks, errors and torn-tail tolerance as :func:`read_entries`; never modifies the file. The
    integer columns are int64: an integer beyond it, which LossEntry takes but no run reaches, raises
    OverflowError. The fast path does not pause the cyclic collector: the parsed objects hold only
    numbers and strings, so CPython does not track them and the collector does not run (pausing it
    measured no faster).
    """
    read = read_columns(path)
    # canonical_curve vectorised: order by step, then segment; the sort is stable, so among equal
    # (step, segment) file order is kept, and the last row of each step is the one to keep.
    order = np.lexsort((read.segment, read.step))
    steps = read.step[order]
    last = np.ones(len(steps), dtype=bool)
    last[:-1] = steps[1:] != steps[:-1]
    keep = order[last]
    return LossCurve(
        **{name: getattr(read, name)[keep] for name in _FIELD_NAMES}, entries_read=read.entries_read
    )


def canonical_curve(entries: Iterable[LossEntry]) -> list[LossEntry]:
    """One entry per step, sorted by step: the newest one (highest segment, then last in file order).

    After a trainer restart from checkpoint c, steps > c are trained again in a new segment; their new
    entries replace the old ones.
    """
    newest: dict[int, LossEntry] = {}
    for entry in entries:
        kept = newest.get(entry.step)
        if kept is None or entry.segment >= kept.segment:
            newest[entry.step] = entry
    return [newest[step] for step in sorted(newest)]
