"""The embedded corpus's identity (the key of its token caches, recorded in manifests): one
format, whether one part or several are hashed, so that no cache or resume sees a new key."""

from __future__ import annotations

import hashlib
from pathlib import Path

from andrea.daemon.data import corpus


def _files(root: Path) -> list[Path]:
    (root / "pkg").mkdir(parents=True)
    contents = {"a.py": "x = 1\n", "pkg/b.py": '"""doc"""\n# c\n', "z.py": ""}
    for rel, text in contents.items():
        (root / rel).write_text(text)
    return corpus.stdlib_files(root)


def _by_hand(root: Path, files: list[Path], part: str) -> str:
    h = hashlib.sha256(f"stdlib:{part}:v{corpus.EXTRACTOR_VERSION}".encode())
    for p in files:
        data = p.read_bytes()
        h.update(f"\0{p.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def test_each_part_has_the_identity_its_format_defines(tmp_path: Path) -> None:
    files = _files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == ["a.py", "pkg/b.py", "z.py"]
    parts = ["code", "comments", "docstrings"]
    expected = {part: _by_hand(tmp_path, files, part) for part in parts}
    assert corpus.stdlib_identities(parts, files, tmp_path) == expected
    assert {p: corpus.stdlib_identity(p, files, tmp_path) for p in parts} == expected
    assert len(set(expected.values())) == 3


def test_an_edited_file_changes_every_part(tmp_path: Path) -> None:
    files = _files(tmp_path)
    before = corpus.stdlib_identities(["code", "comments"], files, tmp_path)
    (tmp_path / "z.py").write_text("y = 2\n")
    after = corpus.stdlib_identities(["code", "comments"], files, tmp_path)
    assert all(before[p] != after[p] for p in before)
