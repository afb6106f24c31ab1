"""Parquet files, the Hugging Face Hub's format for datasets (``data/train-*.parquet``): one
document per row, the string in the arm's text column (``field``, default ``"text"``).

A file is read one row group at a time, and only its text column (pyarrow), so memory holds one
row group's text, never the whole file; its rows are handed on in slices of `ROWS` strings.
A document's id is ``<relative path>:<row number>`` (from 1, through the row groups): the unit of
the held-out split, as a JSON Lines line is. A file that is not Parquet, a column that is missing
or holds no strings, a null, a string that is not UTF-8 or one longer than the arm's bound: a
DataError naming the file (and the row), never a silent skip.

pyarrow is an optional dependency (``pip install 'andrea[parquet]'``): it is imported when a
parquet arm is read, and its absence is a configuration error naming the arm.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from andrea.daemon.config import DEFAULT_MAX_DOCUMENT_BYTES, ConfigError
from andrea.daemon.data.sources import (
    DataError,
    Meter,
    RegularReader,
    Roots,
    Stop,
    check_stop,
)

#: Rows turned into Python strings at a time.
ROWS = 1024
#: What installs pyarrow.
INSTALL = "pip install 'andrea[parquet]'"


def _pyarrow(label: str) -> Any:
    """pyarrow.parquet; ConfigError (naming the arm, after `label`) when it is not installed."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            f'{label}kind = "parquet" reads Parquet files with pyarrow, which is not installed: '
            f"{INSTALL}"
        ) from None
    return pq


def parquet_documents(
    files: list[Path],
    common: Path,
    field: str,
    should_stop: Stop = None,
    label: str = "",
    inside: Roots = None,
    bound: int = DEFAULT_MAX_DOCUMENT_BYTES,
    meter: Meter | None = None,
) -> Iterator[tuple[str, str]]:
    """A parquet arm's documents: `(relative path:row number, text)` per row of each file, in
    order. DataError naming the file (after `label`: "arm 'web': ") and the row."""
    pq = _pyarrow(label)
    for f in files:
        check_stop(should_stop, "reading Parquet arms")
        rel = f.relative_to(common).as_posix()
        with _opened(f, label, inside) as (handle, size):
            yield from _rows(pq, handle, f, rel, field, should_stop, bound, meter, size)


def check_parquet(path: Path, field: str, label: str = "", inside: Roots = None) -> int:
    """What `andrea-trainer --check` reads of a Parquet file: its footer, never a row (a row group
    may be hundreds of MB): DataError, as `parquet_documents` gives it, when it is not Parquet or
    has no string column `field`. Its number of rows."""
    pq = _pyarrow(label)
    with _opened(path, label, inside) as (handle, _):
        parquet = pq.ParquetFile(handle)
        _check_column(parquet.schema_arrow, field)
        return int(parquet.metadata.num_rows)


@contextlib.contextmanager
def _opened(path: Path, label: str, inside: Roots) -> Iterator[tuple[Any, int]]:
    """The regular file `path` as a seekable file for pyarrow, and its size; what pyarrow or the
    reading finds wrong with it becomes a DataError naming it (after `label`)."""
    import pyarrow as pa

    with RegularReader(path, inside) as raw, os.fdopen(raw.fd, "rb", closefd=False) as handle:
        try:
            yield handle, raw.size
        except InterruptedError:  # a stop request, not the file's fault
            raise
        except (pa.ArrowException, OSError) as e:
            raise DataError(f"{label}{path}: {_unreadable(handle, e)}") from None
        except ValueError as e:
            raise DataError(f"{label}{path}: {e}") from None


def _unreadable(handle: Any, e: Exception) -> str:
    """Why a file cannot be read as Parquet, with a hint when it is JSON Lines."""
    try:
        handle.seek(0)
        head = handle.read(64).lstrip()
    except OSError:
        head = b""
    hint = ': it looks like JSON Lines (kind = "jsonl")' if head.startswith(b"{") else ""
    return f"not a readable Parquet file ({str(e).splitlines()[0]}){hint}"


def _rows(
    pq: Any,
    handle: Any,
    path: Path,
    rel: str,
    field: str,
    should_stop: Stop,
    bound: int,
    meter: Meter | None,
    size: int,
) -> Iterator[tuple[str, str]]:
    parquet = pq.ParquetFile(handle)
    _check_column(parquet.schema_arrow, field)
    groups = parquet.num_row_groups
    row = 0
    for group in range(groups):
        check_stop(should_stop, "reading Parquet arms")
        # One thread: a single column gains nothing from more, and the pool's threads each kept
        # freed memory (reading a 120 MB file grew the process by 140 MiB; on one thread by
        # 89 MiB, and by as much for a file three times its size).
        column = parquet.read_row_group(group, columns=[field], use_threads=False).column(0)
        for start in range(0, len(column), ROWS):
            for text in _strings(column.slice(start, ROWS), row, bound):
                row += 1
                yield f"{rel}:{row}", text
        del column  # before the next row group is read: one in memory, never two
        if meter is not None:  # each row group counts as its share of the file's bytes
            meter.read += size * (group + 1) // groups - size * group // groups


def _check_column(schema: Any, field: str) -> None:
    """ValueError when the schema has no string column `field`."""
    import pyarrow as pa

    index = schema.get_field_index(field)
    if index < 0:
        names = ", ".join(schema.names[:8]) or "none"
        raise ValueError(f"no column {field!r} (its columns: {names}); set the arm's field = ...")
    kind = schema.field(index).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        if not pa.types.is_string_view(kind):
            raise ValueError(
                f"column {field!r} holds {kind}, not strings; set the arm's field = ..."
            )


def _strings(values: Any, before: int, bound: int) -> list[str]:
    """The strings of a slice of the column whose first row is number `before + 1`. ValueError
    naming the row of a null, a string longer than `bound` bytes, or one that is not UTF-8."""
    import pyarrow.compute as pc

    if values.null_count:
        first = pc.index(pc.is_null(values), True).as_py()
        raise ValueError(f"row {before + first + 1}: null, not a string")
    lengths = pc.binary_length(values)
    longest = pc.max(lengths).as_py() or 0
    if longest > bound:
        first = pc.index(pc.greater(lengths, bound), True).as_py()
        raise ValueError(
            f"row {before + first + 1}: a document longer than {bound:,} bytes ([data] "
            "max_document_bytes)"
        )
    try:
        strings: list[str] = values.to_pylist()
    except UnicodeDecodeError:
        raise ValueError(
            f"rows {before + 1:,} to {before + len(values):,}: a string that is not UTF-8 text"
        ) from None
    return strings


def text_bytes(path: Path, field: str) -> int:
    """The bytes of the strings in column `field` of the Parquet file `path`, from its metadata
    alone (each row group's uncompressed size of the column, less the 4-byte length of each
    value): what `andreactl plan` estimates tokens from. ValueError when the file has no such
    column, DataError when it is not Parquet."""
    pq = _pyarrow("")
    import pyarrow as pa

    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
    total = 0
    for group in range(meta.num_row_groups):
        rows = meta.row_group(group)
        for c in range(rows.num_columns):
            chunk = rows.column(c)
            if chunk.path_in_schema == field:
                total += max(chunk.total_uncompressed_size - 4 * chunk.num_values, 0)
    return total
