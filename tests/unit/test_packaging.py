"""What a non-editable install ships: every package of the source tree.

`pyproject.toml` lists the packages by hand (their folders are not named as they are imported),
so a new sub-package left off the list works from a checkout and is missing from a wheel: the GPU
check's image and every `pip install .` would fail at its first import."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_in_pyprojects_list() -> None:
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {folder: name for name, folder in setup["package-dir"].items()}
    found = set()
    for folder, name in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([name, *rel.parts]))
    assert sorted(found - set(setup["packages"])) == []
    assert sorted(set(setup["packages"]) - found) == []
