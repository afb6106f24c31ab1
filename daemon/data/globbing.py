"""The files an arm's glob names: `glob.glob`'s rules, without its two traps for a data folder.

- The run directory's own path is never read as a pattern: a run directory named `exp[1]` (or with
  `*` or `?`) made `glob` match the sibling `exp1/` and train on its files without a word. Only the
  pattern's own wildcards are wildcards.
- A `**` descends into each directory once: `glob` follows a link to a directory wherever it leads,
  so a link to `.` (Debian's `/usr/bin/X11 -> .`) listed every file dozens of times under longer and
  longer names, copies that landed on both sides of the held-out split, and two such links made the
  listing exponential: the trainer spun at 100% CPU, deaf to SIGTERM.

As with `glob`, `*`, `?` and `[...]` match within one path component, `**` matches any number of
directories (zero included), and a name that starts with a dot is matched only by a pattern
component that starts with one. A link to a directory is followed, once; where links may lead at
all is `sources.check_link`'s to say.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path

_WILDCARDS = frozenset("*?[")


def has_wildcard(part: str) -> bool:
    return any(c in _WILDCARDS for c in part)


def split_pattern(pattern: str, base: Path) -> tuple[Path, list[str]]:
    """The fixed directory of `pattern` (relative to `base` unless absolute; `~` expanded) and
    the components from its first wildcard on (empty: the pattern names one path)."""
    path = Path(pattern).expanduser()
    parts = list(path.parts)
    first = next((i for i, part in enumerate(parts) if has_wildcard(part)), len(parts))
    fixed = Path(*parts[:first]) if first else Path()
    return (fixed if path.is_absolute() else base / fixed), parts[first:]


def expand(pattern: str, base: Path) -> Iterator[Path]:
    """Every path `pattern` matches, files and directories, each directory a `**` crosses visited
    once (by device and inode): under the first name a depth-first walk in name order reaches it."""
    root, rest = split_pattern(pattern, base)
    if not rest:
        if os.path.lexists(root):
            yield root
        return
    yield from _match(root, rest, set())


def _match(directory: Path, parts: list[str], seen: set[tuple[int, int, int]]) -> Iterator[Path]:
    head, tail = parts[0], parts[1:]
    if head == "**":
        key = _identity(directory, len(parts))
        if key is None or key in seen:
            return
        seen.add(key)
        entries = _entries(directory, "*")
        if not tail:
            yield from (p for p in entries if not p.is_dir())
        else:
            yield from _match(directory, tail, seen)
        for sub in entries:
            if sub.is_dir():
                yield from _match(sub, parts, seen)
        return
    candidates = _entries(directory, head) if has_wildcard(head) else [directory / head]
    for path in candidates:
        if not tail:
            if os.path.lexists(path):
                yield path
        elif path.is_dir():
            yield from _match(path, tail, seen)


def _entries(directory: Path, part: str) -> list[Path]:
    """The entries of `directory` whose name `part` matches (a dot name only if `part` has one)."""
    try:
        names = sorted(os.listdir(directory))  # the first way to a directory is the same each time
    except OSError:
        return []
    dots = part.startswith(".")
    return [
        directory / n for n in names if (dots or not n.startswith(".")) and fnmatchcase(n, part)
    ]


def _identity(directory: Path, depth: int) -> tuple[int, int, int] | None:
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return st.st_dev, st.st_ino, depth
