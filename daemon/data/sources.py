"""The files of a data arm: which files an arm's globs name, how each one is read, and the documents
they hold.

Only the content of a regular file is read, and only as many bytes as its size says. A file of /proc
or /sys is "regular" too, but reports 0 bytes and holds something else (``/proc/self/environ``), fails
its read (``/proc/self/pagemap``: EINVAL) or waits for data (``/proc/kmsg``); a FIFO waits in its open.
Each is refused naming the file (`SourceRejected`, exit 2), never read past its size and never waited
on: the descriptor is opened non-blocking, and after the last byte one more read must find the end.
Links among an arm's files are followed only where they stay: inside the arm's directory (the part
of a glob before its first wildcard) or the run directory. Whoever can write a folder an arm reads can
plant ``notes/zz.md -> /home/op/.ssh/id_ed25519``, and its text would end up in the tokenizer's
vocabulary and the token cache, which anyone may read; so a link that leads elsewhere is refused
(`SourceRejected`, exit 2), naming it and where it leads, when the arm is listed and again on the
opened descriptor (a link swapped in after the listing is refused, not followed). An arm whose data
is kept behind links on purpose says ``links = "follow"``. A file a person names in full (a glob
without a wildcard) is theirs to name, link or not; what it reaches must be a regular file all
the same.
A stop requested meanwhile is honoured between files (and between batches of lines).

Documents, the unit of the held-out split (daemon/data/heldout.py):
- ``text``: one file; its id is its path relative to the arm's common directory;
- ``jsonl``: one line of a ``.jsonl``, ``.jsonl.gz`` or ``.jsonl.zst`` file
  (daemon/data/zstdstream.py), the string at the arm's ``field``; its id is
  ``<relative path>:<line number>``. A malformed line is an error naming the file and line;
- ``parquet``: one row of a Parquet file, the string in the arm's ``field`` column
  (daemon/data/parquet.py); its id is ``<relative path>:<row number>``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from andrea.daemon.config import DEFAULT_MAX_DOCUMENT_BYTES, ArmSpec
from andrea.daemon.data.globbing import expand, split_pattern
from andrea.daemon.data.zstdstream import SUFFIX as ZSTD_SUFFIX
from andrea.daemon.data.zstdstream import ZstdDataError, ZstdReader
from andrea.daemon.rundir.boundedio import FileRejected, open_regular
from andrea.daemon.rundir.layout import ARCHIVE_DIR, is_run_file

log = logging.getLogger(__name__)

#: Bytes per read; a stop request is looked at between two.
_CHUNK = 1 << 20
#: The field of a JSON Lines arm unless its config names another.
DEFAULT_FIELD = "text"
#: What a lone surrogate of a JSON string becomes.
REPLACEMENT_CHARACTER = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
#: The first bytes of every Parquet file.
PARQUET_MAGIC = b"PAR1"

Stop = Callable[[], bool] | None


class DataError(RuntimeError):
    """A configured data source is missing, unreadable or unusable."""


class SourceRejected(DataError):
    """A data file that is not a regular file's content: a FIFO, a device, a file of /proc or /sys,
    one that changed while it was read, or one this process may not read. A mistake of the
    configuration's globs or of the file's permissions (exit 2), never waited on."""


def check_stop(should_stop: Stop, what: str) -> None:
    """InterruptedError when a stop was requested (a stop during data preparation is honoured at
    once)."""
    if should_stop is not None and should_stop():
        raise InterruptedError(f"stop requested while {what}")


#: The directories an arm's links may lead into (resolved); None: any (``links = "follow"``).
Roots = tuple[Path, ...] | None


def link_roots(patterns: list[str], base: Path) -> tuple[Path, ...]:
    """The directories of `patterns` (relative to `base`), resolved: each glob's part before its
    first wildcard (a pattern without one names its file: whatever it is, it was named)."""
    roots = [split_pattern(pattern, base)[0] for pattern in patterns]
    return tuple(sorted({Path(os.path.realpath(r)) for r in roots}))


#: What a refused link of an arm's says to do about it.
FOLLOW_ARM_LINKS = 'set links = "follow" on the arm in run.toml to read data kept behind links'


def check_link(
    path: Path, roots: Roots, real: str | None = None, advice: str = FOLLOW_ARM_LINKS
) -> None:
    """SourceRejected when `path` (or, once opened, `real`: where its descriptor leads) lies
    outside every one of `roots`; its message ends with `advice`."""
    if roots is None:
        return
    target = Path(real if real is not None else os.path.realpath(path))
    if any(target.is_relative_to(r) for r in roots):
        return
    raise SourceRejected(
        f"{path} leads to {target} through a link, outside {' and '.join(map(str, roots))}: "
        "refused, so that a planted link never puts another file's text into the tokenizer or "
        f"the token cache; {advice} on purpose"
    )


def _opened(fd: int, path: Path) -> str:
    """Where the descriptor `fd` (opened through `path`) leads, as the kernel knows it."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: where the path leads now
        return os.path.realpath(path)


class Meter:
    """Bytes read so far from an arm's files, as they are read (what the progress of its encoding
    counts: for a .gz file, the compressed bytes)."""

    def __init__(self) -> None:
        self.read = 0


class RegularReader(io.RawIOBase):
    """A regular file's bytes, exactly as many as its size says; then the end must follow. With
    `inside`, the file opened must lie in one of those directories (`check_link`)."""

    def __init__(self, path: Path, inside: Roots = None, meter: Meter | None = None) -> None:
        super().__init__()
        self.path = path
        self.meter = meter
        try:
            self.fd = open_regular(path, follow_symlinks=True)
        except FileRejected as e:
            raise SourceRejected(str(e)) from None
        except FileNotFoundError:
            raise DataError(f"{path} does not exist") from None
        except OSError as e:
            raise SourceRejected(f"{path}: cannot be read: {e.strerror or e}") from None
        if inside is not None:
            try:
                check_link(path, inside, _opened(self.fd, path))
            except SourceRejected:
                os.close(self.fd)
                raise
        self.size = os.fstat(self.fd).st_size
        self.done = 0
        self._ended = False

    def readable(self) -> bool:
        return True

    # Narrower than RawIOBase's (any writable buffer): io's buffered readers pass these two.
    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), self.size - self.done)
        if want <= 0:
            self._check_end()
            return 0
        try:
            n = os.readv(self.fd, [memoryview(buffer)[:want]])
        except OSError as e:
            raise SourceRejected(f"{self.path}: cannot be read: {e.strerror or e}") from None
        if n == 0:
            raise SourceRejected(
                f"{self.path}: ended after {self.done:,} of its {self.size:,} bytes: it changed "
                "while it was read"
            )
        self.done += n
        if self.meter is not None:
            self.meter.read += n
        return n

    def _check_end(self) -> None:
        if self._ended:
            return
        try:
            more = os.read(self.fd, 1)
        except BlockingIOError:
            raise SourceRejected(
                f"{self.path}: a read would wait for data: not a regular file's content "
                "(a file of /proc?)"
            ) from None
        except OSError as e:
            raise SourceRejected(f"{self.path}: cannot be read: {e.strerror or e}") from None
        if more:
            raise SourceRejected(
                f"{self.path}: holds more than the {self.size:,} bytes its size says: a file of "
                "/proc or /sys, or one still being written"
            )
        self._ended = True

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def oversize_text(label: str, path: Path, size: int, bound: int) -> str:
    """The refusal of a text arm's file over the document bound (`label`: "arm 'notes': ")."""
    return (
        f"{label}{path}: a text document of {size:,} bytes, longer than {bound:,} ([data] "
        "max_document_bytes: a text arm's file is one document, held whole in memory while it is "
        "encoded); split it into several files, or raise the bound"
    )


def read_file(
    path: Path,
    inside: Roots = None,
    should_stop: Stop = None,
    meter: Meter | None = None,
    bound: int | None = None,
    label: str = "",
) -> bytes:
    """The whole content of the regular file `path` (SourceRejected, DataError naming it), read in
    chunks with a look at `should_stop` after each: a large file never delays a stop. A file of
    more than `bound` bytes is a DataError naming it (after `label`), before anything is read
    or allocated: one document that size would exhaust memory in the tokenizer."""
    with RegularReader(path, inside, meter) as r:
        if bound is not None and r.size > bound:
            raise DataError(oversize_text(label, path, r.size, bound))
        out = bytearray(r.size)
        view = memoryview(out)
        while r.done < r.size:
            check_stop(should_stop, "reading text arms")
            if not r.readinto(view[r.done : r.done + _CHUNK]):
                break
        r.readinto(bytearray(1))  # the end must follow
        return bytes(out)


#: The most time between two progress lines while one file is hashed (as an encoding logs).
HASH_LOG_EVERY_S = 10.0


def file_digest(
    path: Path,
    inside: Roots = None,
    should_stop: Stop = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, bytes]:
    """(size, sha256 digest) of the regular file `path`, streamed (a stop request is looked at
    after each chunk). A file that takes longer than HASH_LOG_EVERY_S to hash (gigabytes) logs
    how far it is, at that interval: a start that identifies its data is never silent."""
    sha = hashlib.sha256()
    buf = bytearray(_CHUNK)
    with RegularReader(path, inside) as r:
        started = logged = clock()
        while n := r.readinto(buf):
            check_stop(should_stop, "hashing the data's files")
            sha.update(memoryview(buf)[:n])
            if (now := clock()) - logged >= HASH_LOG_EVERY_S:
                logged = now
                log.info(
                    "identifying the data: %s hashed, %s of %s (%.0f MB/s)",
                    path,
                    _size(r.done),
                    _size(r.size),
                    r.done / (now - started) / 1e6,
                )
        return r.size, sha.digest()


def _size(n: int) -> str:
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def arm_roots(spec: ArmSpec, base: Path) -> Roots:
    """Where links among a text, jsonl or parquet arm's files may lead: the run directory `base`
    and the arm's directories (`link_roots`); None when the arm follows every link."""
    if spec.links == "follow":
        return None
    return tuple(sorted({Path(os.path.realpath(base)), *link_roots(spec.paths, base)}))


def arm_files(spec: ArmSpec, base: Path) -> tuple[list[Path], Path]:
    """A `text` or `jsonl` arm's files in a fixed order, and their common directory. Directories
    that a `**` glob matches are passed over; so is anything that is not a file (a FIFO, a
    socket), which `stat` tells without opening it. A link that leads out of the arm's directory
    and the run's is refused (`check_link`) before any file is read."""
    files = _distinct(
        sorted({p for pat in spec.paths for p in expand(pat, base) if p.is_file()}), base
    )
    if not files:
        raise DataError(f"arm {spec.name!r}: no files match {spec.paths} (relative to {base})")
    roots = arm_roots(spec, base)
    for f in files:
        check_link(f, roots)
    return files, Path(os.path.commonpath([f.parent for f in files]))


def _distinct(files: list[Path], base: Path) -> list[Path]:
    """`files` without the run directory's own files (its config, policy, checkpoints and pivot
    archives change as it runs: an arm of `*` beside them trained on run.toml and was refused at
    every restart) and without a second name of one file (the first name, in order, stays).
    DataError for a name that is not UTF-8: a document's id is its path, and it must be text."""
    run_dir, seen, out = os.path.realpath(base), set(), []
    archive = os.path.join(run_dir, ARCHIVE_DIR, "")
    for f in files:
        try:
            os.fsencode(f).decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(
                f"{os.fsencode(f)!r}: a file name that is not UTF-8; rename it"
            ) from None
        real = os.path.realpath(f)
        own = os.path.dirname(real) == run_dir and is_run_file(os.path.basename(real))
        if real in seen or own or real.startswith(archive):
            continue
        seen.add(real)
        out.append(f)
    return out


def text_documents(
    files: list[Path],
    common: Path,
    should_stop: Stop = None,
    inside: Roots = None,
    meter: Meter | None = None,
    bound: int | None = DEFAULT_MAX_DOCUMENT_BYTES,
    label: str = "",
) -> Iterator[tuple[str, bytes]]:
    """A text arm's documents: `(path relative to common, bytes)` per file. DataError naming the
    file (after `label`: "arm 'notes': ") for one longer than `bound` bytes, as a JSON Lines
    line is bounded (None: unbounded, for a tool of a person's own files)."""
    for f in files:
        check_stop(should_stop, "reading text arms")
        document = read_file(f, inside, should_stop, meter, bound, label)
        yield f.relative_to(common).as_posix(), document


class _Oversize(Exception):
    """A line longer than the bound: `line` is its number."""

    def __init__(self, line: int) -> None:
        self.line = line


class _LooksParquet(Exception):
    """A JSON Lines arm's file that begins as a Parquet file does."""


def _lines(
    path: Path, bound: int, should_stop: Stop, meter: Meter | None, inside: Roots = None
) -> Iterator[bytes]:
    """The lines of a JSON Lines file (gunzipped when its name ends in .gz, decompressed when it
    ends in .zst), without their newline. Read in chunks of `_CHUNK` bytes whatever the lines'
    length: a line longer than `bound` (a gzip bomb of NULs holds no newline at all) raises
    `_Oversize` once `bound` bytes of it are held, never more; a stop request is looked at after
    every chunk. `_LooksParquet` for a file that begins as Parquet files do."""
    raw = RegularReader(path, inside, meter)
    with io.BufferedReader(raw, _CHUNK) as buffered:
        if path.name.endswith(ZSTD_SUFFIX):
            with io.BufferedReader(ZstdReader(buffered), _CHUNK) as unzstd:
                yield from _split(unzstd, bound, should_stop)
            buffered.read()
            return
        if not path.name.endswith(".gz"):
            if buffered.peek(len(PARQUET_MAGIC))[: len(PARQUET_MAGIC)] == PARQUET_MAGIC:
                raise _LooksParquet
            yield from _split(buffered, bound, should_stop)
            return
        with gzip.GzipFile(fileobj=buffered, mode="rb") as unzipped:
            yield from _split(unzipped, bound, should_stop)
        # Whatever follows the last member must be read too (and the end checked).
        buffered.read()


def _split(stream: io.BufferedIOBase, bound: int, should_stop: Stop) -> Iterator[bytes]:
    partial: list[bytes] = []
    held = 0  # bytes of the unfinished line in `partial`
    number = 0  # lines yielded
    while chunk := stream.read(_CHUNK):
        check_stop(should_stop, "reading JSON Lines arms")
        lines = chunk.split(b"\n")
        if len(lines) > 1:
            lines[0] = b"".join([*partial, lines[0]])
            partial, held = [], 0
        for line in lines[:-1]:
            number += 1
            if len(line) > bound:
                raise _Oversize(number)
            yield line
        held += len(lines[-1])
        if held > bound:
            raise _Oversize(number + 1)
        partial.append(lines[-1])
    if held:
        yield b"".join(partial)


def json_type(value: object) -> str:
    """A decoded value for a person who wrote the line: its type by JSON's names ("JSON null",
    "a JSON array", "a JSON number"), never Python's."""
    if value is None:
        return "JSON null"
    names = ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"))
    return "a JSON " + next((n for kind, n in names if isinstance(value, kind)), "number")


def _document(line: bytes, field: str) -> str:
    """The string at `field` of one JSON Lines line; ValueError saying what is wrong with it."""
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        what = "an empty line" if not line.strip() else f"not JSON ({e.msg}, column {e.colno})"
        raise ValueError(what) from None
    except (UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not JSON ({type(e).__name__})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{json_type(value)}, not an object")
    if field not in value:
        keys = ", ".join(sorted(value)[:8]) or "none"
        raise ValueError(f"no field {field!r} (its fields: {keys}); set the arm's field = ...")
    text = value[field]
    if not isinstance(text, str):
        raise ValueError(f"field {field!r} is {json_type(text)}, not a string")
    return text


def replace_surrogates(text: str) -> tuple[str, int]:
    """`text` with each lone surrogate (a `\\ud800` escape without its pair, valid JSON but not
    text: no UTF-8 encodes it) replaced by U+FFFD, and how many there were."""
    if _SURROGATE.search(text) is None:
        return text, 0
    return _SURROGATE.subn(REPLACEMENT_CHARACTER, text)


def jsonl_documents(
    files: list[Path],
    common: Path,
    field: str,
    should_stop: Stop = None,
    label: str = "",
    inside: Roots = None,
    bound: int = DEFAULT_MAX_DOCUMENT_BYTES,
    meter: Meter | None = None,
) -> Iterator[tuple[str, str]]:
    """A JSON Lines arm's documents: `(relative path:line number, text)` per line. DataError
    naming the file and the line (after `label`: "arm 'web': ") for a malformed one or one longer
    than `bound` bytes; never a silent skip. Lone surrogates are replaced (`replace_surrogates`),
    counted and logged once per file."""
    for f in files:
        check_stop(should_stop, "reading JSON Lines arms")
        rel = f.relative_to(common).as_posix()
        lineno = replaced = first = 0
        try:
            for lineno, line in enumerate(_lines(f, bound, should_stop, meter, inside), 1):
                try:
                    text, n = replace_surrogates(_document(line, field))
                except ValueError as e:
                    raise DataError(f"{label}{f}:{lineno}: {e}") from None
                if n and not replaced:
                    first = lineno
                replaced += n
                yield f"{rel}:{lineno}", text
        except _Oversize as e:
            raise DataError(
                f"{label}{f}:{e.line}: a line longer than {bound:,} bytes ([data] "
                "max_document_bytes; no newline within it, if this is not meant as one document)"
            ) from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise DataError(
                f"{label}{f}: not a readable gzip file after line {lineno} ({e})"
            ) from None
        except ZstdDataError as e:
            raise DataError(
                f"{label}{f}: not a readable zstd file after line {lineno} ({e})"
            ) from None
        except _LooksParquet:
            raise DataError(
                f"{label}{f}: a Parquet file (it begins with {PARQUET_MAGIC.decode()}), not JSON "
                'Lines: read it with an arm of kind = "parquet" (its text column: field = ...)'
            ) from None
        if replaced:
            log.warning(
                "%s%s: %d lone surrogate escape(s) (first on line %d) replaced by U+FFFD: JSON "
                "allows them, but no text holds them",
                label,
                f,
                replaced,
                first,
            )
