"""Bounded reads of run-directory files: regular files only, never more bytes than the format allows.

Every file a daemon reads can be replaced by a person or a program: a 64 GiB sparse file, a symlink to
`/dev/zero`, a FIFO, a directory. Reading any of those with `read_bytes()` either allocates without
limit (a MemoryError on every restart) or blocks forever. So each reader states the most its format can
need, and gets a `FileRejected` naming the path and the reason before a single byte is allocated.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRejected(ValueError):
    """A run-directory file that is not a regular file, or larger than its format allows."""


def open_regular(path: Path, limit: int | None = None) -> int:
    """A read-only descriptor of `path`, checked to be a regular file of at most `limit` bytes.

    O_NONBLOCK keeps a FIFO from blocking the open; the check runs on the opened descriptor (fstat),
    so the file cannot be swapped between the check and the read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRejected(f"{path}: not a regular file ({_kind(st.st_mode)})")
        if limit is not None and st.st_size > limit:
            raise FileRejected(
                f"{path}: {st.st_size:,} bytes, more than the {limit:,} its format allows"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: Path, limit: int) -> bytes:
    """The whole content of the regular file `path`, which must hold at most `limit` bytes.
    Raises FileRejected, or OSError (FileNotFoundError included) when it cannot be opened."""
    fd = open_regular(path, limit)
    try:
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # the file grew after the check
                raise FileRejected(f"{path}: grew past the {limit:,} bytes its format allows")
        return b"".join(chunks)
    finally:
        os.close(fd)


def regular_size(path: Path) -> int:
    """The size of `path` if it is a regular file (symlinks followed); FileRejected otherwise."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise FileRejected(f"{path}: not a regular file ({_kind(st.st_mode)})")
    return st.st_size


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"
