"""The embedded default corpus: the Python standard library's own source tree, split into arms.

Present wherever Python is, so a newcomer trains on real text with no download. Each `.py` file is
split with `tokenize` into three parts:
- docstrings: string literals that stand alone as a statement (module, class, function docs);
- comments: `#` comments, one per line;
- code: the rest of the source, with those two removed.

Third-party packages (site-packages) and the test suites are left out: they differ between
machines and would make the corpus identity depend on what else is installed.
"""

from __future__ import annotations

import hashlib
import io
import os
import sysconfig
import tokenize
from collections.abc import Callable, Sequence
from pathlib import Path

from andrea.daemon.data.sources import Roots, check_stop, file_digest

PARTS = ("docstrings", "code", "comments")
#: Bump when the extraction rules change: it is part of every stdlib arm's identity.
EXTRACTOR_VERSION = 1
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "__pycache__",
    "lib2to3",
}


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The corpus's files in a fixed order (sorted relative paths)."""
    root = root or stdlib_root()
    out: list[Path] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS)
        out.extend(Path(d, f) for f in sorted(files) if f.endswith(".py"))
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def listing_digest(
    files: list[Path],
    root: Path,
    salt: str,
    should_stop: Callable[[], bool] | None = None,
    inside: Roots = None,
) -> str:
    """Identity of a set of source files: relative paths, sizes and content hashes. Each file is
    read as a regular file only (daemon/data/sources.py), lying in `inside` when given, and a stop
    request is honoured between files."""
    return _salted(_listing(files, root, should_stop, inside), salt)


def _listing(
    files: list[Path], root: Path, should_stop: Callable[[], bool] | None, inside: Roots
) -> list[bytes]:
    out = []
    for p in files:
        check_stop(should_stop, "hashing the data's files")
        size, digest = file_digest(p, inside, should_stop)
        out.append(f"\0{p.relative_to(root).as_posix()}\0{size}\0".encode() + digest)
    return out


def _salted(listing: list[bytes], salt: str) -> str:
    h = hashlib.sha256(salt.encode())
    for entry in listing:
        h.update(entry)
    return h.hexdigest()


def _stdlib_salt(part: str) -> str:
    return f"stdlib:{part}:v{EXTRACTOR_VERSION}"


def stdlib_identity(part: str, files: list[Path], root: Path) -> str:
    return listing_digest(files, root, _stdlib_salt(part))


def stdlib_identities(parts: Sequence[str], files: list[Path], root: Path) -> dict[str, str]:
    """`stdlib_identity` of each part, the files read and hashed once for all of them (a third
    of the time every start of a three-arm run spent hashing the corpus)."""
    listing = _listing(files, root, None, None)
    return {part: _salted(listing, _stdlib_salt(part)) for part in parts}


def split_source(src: str) -> dict[str, str]:
    """Split one module's source into docstrings, code and comments."""
    lines = src.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    docs, comments, cut = [], [], []
    # A string token that opens a logical line and is alone on it is a docstring-like statement.
    line_start = True
    pending: tokenize.TokenInfo | None = None
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments.append(tok.string.lstrip("#").strip())
            cut.append((offset(tok.start), offset(tok.end)))
            continue
        if tok.type in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            continue
        if tok.type == tokenize.NEWLINE:
            if pending is not None:
                docs.append(_literal_text(pending.string))
                cut.append((offset(pending.start), offset(pending.end)))
            pending, line_start = None, True
            continue
        if line_start and tok.type == tokenize.STRING:
            pending = tok
        else:
            pending = None
        line_start = False

    kept, last = [], 0
    for a, b in sorted(cut):
        kept.append(src[last:a])
        last = b
    kept.append(src[last:])
    code = "\n".join(line.rstrip() for line in "".join(kept).splitlines() if line.strip())
    return {
        "docstrings": "\n\n".join(d for d in docs if d),
        "code": code,
        "comments": "\n".join(c for c in comments if c),
    }


def _literal_text(s: str) -> str:
    # Strip the prefix and quotes without evaluating: escapes stay as written in the source.
    body = s.lstrip("rRbBuUfF")
    q = body[:3] if body[:3] in ('"""', "'''") else body[:1]
    return body[len(q) : len(body) - len(q)].strip()


def extract_stdlib_documents(
    files: list[Path], root: Path, should_stop: Callable[[], bool] | None = None
) -> dict[str, list[tuple[str, bytes]]]:
    """Run `split_source` over every file: per part, the non-empty `(module path relative to
    root, UTF-8 bytes)` documents in file order.

    Checks `should_stop` between files so that a stop request during a first start (which can
    take several seconds here) is honoured at once.
    """
    parts: dict[str, list[tuple[str, bytes]]] = {p: [] for p in PARTS}
    for path in files:
        if should_stop is not None and should_stop():
            raise InterruptedError("stop requested during corpus extraction")
        try:
            with tokenize.open(path) as f:
                split = split_source(f.read())
        except (SyntaxError, tokenize.TokenError, UnicodeDecodeError, ValueError):
            continue  # a few stdlib files are deliberately malformed (lib2to3 fixtures and the like)
        doc_id = path.relative_to(root).as_posix()
        for p in PARTS:
            if split[p]:
                parts[p].append((doc_id, split[p].encode("utf-8")))
    return parts
