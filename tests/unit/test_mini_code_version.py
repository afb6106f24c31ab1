"""The mini problem's code version covers every module of its package, not only one file."""

from __future__ import annotations

import pkgutil
import shutil
from pathlib import Path

from andrea.control import mini_problem as mini

PACKAGE_DIR = Path(mini.__file__).resolve().parent


def _copy_of_the_package(tmp_path: Path) -> Path:
    copy = tmp_path / "mini_problem"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_the_files_hashed_are_the_modules_of_the_package() -> None:
    # The modules as Python's import system finds them, independently of how the hash lists files.
    modules = {
        f"{info.name}/__init__.py" if info.ispkg else f"{info.name}.py"
        for info in pkgutil.iter_modules([str(PACKAGE_DIR)])
    } | {"__init__.py"}

    hashed = {path.relative_to(PACKAGE_DIR).as_posix() for path in mini.source_files()}

    assert hashed == modules
    assert {"schema.py", "experiment.py", "validation.py", "checkpoint.py", "cli.py"} <= hashed


def test_an_edit_to_any_module_changes_the_code_version(tmp_path: Path) -> None:
    copy = _copy_of_the_package(tmp_path)
    original = mini.code_version()
    # The version depends on the source, not on where the package lies.
    assert mini.code_version(copy) == original

    versions = {}
    for path in mini.source_files(copy):
        source = path.read_bytes()
        path.write_bytes(source + b"\n")
        versions[path.name] = mini.code_version(copy)
        path.write_bytes(source)

    assert len(versions) == len(mini.source_files())
    assert original not in versions.values()
    assert len(set(versions.values())) == len(versions)
    assert mini.code_version(copy) == original


def test_a_module_added_or_renamed_changes_the_code_version(tmp_path: Path) -> None:
    copy = _copy_of_the_package(tmp_path)
    original = mini.code_version(copy)

    (copy / "extra.py").write_text('"""A new module."""\n')
    added = mini.code_version(copy)
    (copy / "extra.py").rename(copy / "renamed.py")
    renamed = mini.code_version(copy)

    assert len({original, added, renamed}) == 3
