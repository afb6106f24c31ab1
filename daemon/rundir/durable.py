"""Crash-safe file writes: temp file → fsync → rename → fsync of the directory.

Without the directory fsync a rename can be lost on power failure even though the file's data
was synced; most public trainers skip it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_path(path: Path) -> Path:
    # The pid keeps two processes that materialise the same file (a shared cache) apart.
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def atomic_write(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    """Create or replace `path` so that a crash at any moment leaves either the old or the new file.

    `fill` writes the content to the open temporary file. On error the temporary file is removed
    and the old file (if any) is untouched.
    """
    commit(stage(path, fill), path)


def commit(tmp: Path, path: Path) -> None:
    """Rename the staged `tmp` over `path`, then fsync the directory; on error `tmp` is removed."""
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def stage(path: Path, fill: Callable[[BinaryIO], object]) -> Path:
    """`path`'s temporary file, filled by `fill` and fsynced, not yet in place: the caller renames
    it over `path` (a commit that needs no more space) or removes it. On error nothing is left."""
    tmp = tmp_path(path)
    # The temporary's name is known in advance: a link planted there is refused (ELOOP), never
    # written through.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))
