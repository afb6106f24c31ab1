"""Bounded reads of run-directory files: regular files only, never more bytes than the format allows,
and never through a symbolic link.

Every file a daemon or a tool reads can be replaced by a person or a program: a 64 GiB sparse file, a
symlink to `/dev/zero`, a FIFO, a directory. Reading any of those with `read_bytes()` either allocates
without limit (a MemoryError on every restart) or blocks forever. So each reader states the most its
format can need, and gets a `FileRejected` naming the path and the reason before a single byte is
allocated.

A link is refused too. Whoever can write a run directory can plant `policy.toml -> /etc/shadow`; a tool
run by root that followed it would print, plot or export a file its owner could never read. So the
files of a run directory are read where they lie: the last component is opened without following a
link, and `open_inside` opens every directory between the run directory and the file the same way.
Files a person names on the command line (`--config`, `--policy`) may be links
(`follow_symlinks=True`); they are still regular files of bounded size.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path, PurePath
from typing import Any

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Why a link in a run directory is refused, in every message that refuses one.
LINK_REFUSED = "files in a run directory are never read through a link"


class FileRejected(ValueError):
    """A run-directory file that is not a regular file (a link, a FIFO, a device, a directory), or
    larger than its format allows."""


def irregular(path: Path, *, follow_symlinks: bool = False) -> str | None:
    """What lies at `path` when it is not a regular file ("a symbolic link", "a FIFO", ...), None for
    a regular file. The link itself is looked at, never its target, unless `follow_symlinks` (a
    file a person names). Nothing is opened, so a FIFO never blocks. FileNotFoundError when nothing
    is there."""
    mode = os.stat(path, follow_symlinks=follow_symlinks).st_mode
    return None if stat.S_ISREG(mode) else _kind(mode)


def open_regular(path: Path, limit: int | None = None, *, follow_symlinks: bool = False) -> int:
    """A read-only descriptor of `path`, checked to be a regular file of at most `limit` bytes.

    Nothing but a regular file is opened (a FIFO would block the open, a device may act on it). The
    check is repeated on the opened descriptor (fstat), so the file cannot be swapped between the
    check and the read. Without `follow_symlinks` a link is refused, not followed."""
    return _open_file(path, path, limit, follow_symlinks, None)


def _open_file(
    path: Path, shown: Path, limit: int | None, follow_symlinks: bool, dir_fd: int | None
) -> int:
    st = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    _check(shown, st, limit)
    try:
        fd = os.open(path, _READ if follow_symlinks else _READ | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:  # swapped for a link since the stat
            raise _link(shown) from None
        raise
    try:
        opened = os.fstat(fd)
        _check(shown, opened, limit)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise FileRejected(f"{shown}: replaced while it was being opened")
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_inside(root: Path, relative: PurePath | str, limit: int | None = None) -> int:
    """A read-only descriptor of the regular file `root/relative`, at most `limit` bytes, reached
    without following a link anywhere below `root`: each directory on the way is opened relative to
    the one before it, so none can be swapped for a link between a check and the read."""
    rel = PurePath(relative)
    if not rel.parts or rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"{rel}: not a path inside {root}")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        here = Path(root)
        for name in rel.parts[:-1]:
            here = here / name
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
            if not stat.S_ISDIR(mode):
                raise FileRejected(f"{here}: not a directory ({_kind(mode)}); {LINK_REFUSED}")
            inner = os.open(name, _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        return _open_file(Path(rel.name), Path(root, rel), limit, False, fd)
    finally:
        os.close(fd)


def _read_fd(fd: int, path: Path, limit: int) -> bytes:
    chunks, total = [], 0
    while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # the file grew after the check
            raise FileRejected(f"{path}: grew past the {limit:,} bytes its format allows")
    return b"".join(chunks)


def read_bounded(path: Path, limit: int, *, follow_symlinks: bool = False) -> bytes:
    """The whole content of the regular file `path`, which must hold at most `limit` bytes.
    Raises FileRejected (a link among them, unless `follow_symlinks`), or OSError
    (FileNotFoundError included) when it cannot be opened."""
    fd = open_regular(path, limit, follow_symlinks=follow_symlinks)
    try:
        return _read_fd(fd, path, limit)
    finally:
        os.close(fd)


def read_inside(root: Path, relative: PurePath | str, limit: int) -> bytes:
    """The content of `root/relative` as `open_inside` reaches it: no link below `root`, a regular
    file of at most `limit` bytes."""
    fd = open_inside(root, relative, limit)
    try:
        return _read_fd(fd, Path(root, relative), limit)
    finally:
        os.close(fd)


def parse_json(raw: bytes | str, path: Path) -> Any:
    """JSON of a run-directory file. ValueError naming `path` for anything that is not JSON, a
    nesting too deep for the parser included (`[[[[…` in a bounded file exhausts Python's
    recursion limit, a RecursionError that no reader expects)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def read_json(path: Path, limit: int, *, follow_symlinks: bool = False) -> Any:
    """`read_bounded`, parsed as JSON (`parse_json`): ValueError when it is not JSON."""
    return parse_json(read_bounded(path, limit, follow_symlinks=follow_symlinks), path)


def read_json_inside(root: Path, relative: PurePath | str, limit: int) -> Any:
    """`read_inside`, parsed as JSON (`parse_json`): ValueError when it is not JSON."""
    return parse_json(read_inside(root, relative, limit), Path(root, relative))


def regular_size(path: Path) -> int:
    """The size of `path` if it is a regular file (a link is not); FileRejected otherwise."""
    st = os.lstat(path)
    _check(path, st, None)
    return st.st_size


def _check(path: Path, st: os.stat_result, limit: int | None) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _link(path)
    if not stat.S_ISREG(st.st_mode):
        raise FileRejected(f"{path}: not a regular file ({_kind(st.st_mode)})")
    if limit is not None and st.st_size > limit:
        raise FileRejected(
            f"{path}: {st.st_size:,} bytes, more than the {limit:,} its format allows"
        )


def _link(path: Path) -> FileRejected:
    return FileRejected(f"{path}: not a regular file (a symbolic link; {LINK_REFUSED})")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"
