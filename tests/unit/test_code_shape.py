"""Rooms a reader can see whole: no class over 400 lines and no function over 60 in the product's
packages, and andreactl's shell stays a shell (its commands live in control/commands/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "control", "protocol")
MAX_CLASS_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_SHELL_LINES = 250


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _oversized(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not hasattr(node, "end_lineno"):
            continue
        lines = node.end_lineno - node.lineno + 1
        if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
            found.append(f"class {node.name}: {lines} lines (at most {MAX_CLASS_LINES})")
        elif (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines > MAX_FUNCTION_LINES
        ):
            found.append(f"{node.name}(): {lines} lines (at most {MAX_FUNCTION_LINES})")
    return [f"{path.relative_to(root)}: {f}" for f in found]


def test_the_packages_have_sources() -> None:
    assert len(_sources()) > 50


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_class_or_function_is_too_big_to_read(path: Path) -> None:
    assert _oversized(path) == []


def test_the_check_finds_an_oversized_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    big = tmp_path / "big.py"
    big.write_text(f"def big():\n{body}\n")
    assert _oversized(big, tmp_path) == [
        f"big.py: big(): {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})"
    ]


def test_andreactl_is_only_the_shell() -> None:
    lines = len((ROOT / "control" / "andreactl.py").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_SHELL_LINES
