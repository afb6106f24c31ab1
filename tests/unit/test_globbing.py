"""Which files an arm's globs name: glob's rules, measured against `glob.glob` itself on a plain
tree, and the three places it went wrong for a data folder: a run directory whose own name holds a
wildcard, a link that leads back up the tree, and the run's own files beside the data."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from andrea.daemon.config import ArmSpec
from andrea.daemon.data.globbing import expand
from andrea.daemon.data.sources import DataError, arm_files


def tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)


NAMES = ["a.md", ".hidden.md", "b.txt", "sub/c.md", "sub/deep/d.md", ".git/e.md", "sub/.f.md"]


@pytest.mark.parametrize(
    "pattern",
    ["*.md", "**/*.md", "sub/**", "sub/*/*.md", "**/.*.md", "*/c.md", "[ab].*", "?.md", "nope/*"],
)
def test_the_rules_are_globs(tmp_path: Path, pattern: str) -> None:
    tree(tmp_path, NAMES)
    ours = {str(p) for p in expand(pattern, tmp_path) if p.is_file()}
    theirs = {p for p in glob.glob(str(tmp_path / pattern), recursive=True) if Path(p).is_file()}
    assert ours == theirs


def arm(*paths: str) -> ArmSpec:
    return ArmSpec(name="notes", kind="text", paths=list(paths))


def names(files: list[Path], base: Path) -> list[str]:
    return [f.relative_to(base).as_posix() for f in files]


def test_a_run_directory_named_with_a_wildcard_reads_its_own_files(tmp_path: Path) -> None:
    run, sibling = tmp_path / "exp[1]", tmp_path / "exp1"
    tree(run, ["notes/mine.md"])
    tree(sibling, ["notes/theirs.md"])  # what glob("exp[1]/notes/*.md") matched
    files, _ = arm_files(arm("notes/*.md"), run)
    assert names(files, run) == ["notes/mine.md"]


def test_a_link_back_up_the_tree_lists_each_file_once(tmp_path: Path) -> None:
    tree(tmp_path, [f"notes/n{i}.md" for i in range(30)] + ["notes/sub/s.md"])
    # Two links to the folder itself: glob listed 30 files under names ever longer, then spun.
    os.symlink(".", tmp_path / "notes" / "a")
    os.symlink(".", tmp_path / "notes" / "b")
    os.symlink("..", tmp_path / "notes" / "sub" / "up")
    files, _ = arm_files(arm("notes/**/*.md"), tmp_path)
    assert names(files, tmp_path) == [f"notes/n{i}.md" for i in sorted(range(30), key=str)] + [
        "notes/sub/s.md"
    ]


def test_two_names_of_one_file_are_one_document(tmp_path: Path) -> None:
    tree(tmp_path, ["notes/x.md"])
    os.symlink("x.md", tmp_path / "notes" / "y.md")
    files, _ = arm_files(arm("notes/*.md", "notes/x.md"), tmp_path)
    assert names(files, tmp_path) == ["notes/x.md"]


def test_the_runs_own_files_are_never_data(tmp_path: Path) -> None:
    own = [
        "run.toml",
        "policy.toml",
        "step_000003.json",
        "step_000003.bin",
        "step_000003.bin.7.tmp",
    ]
    tree(tmp_path, [*own, "archive/pivot-000003-x/policy.toml", "doc.txt", "step_notes.txt"])
    files, _ = arm_files(arm("*", "**/*.toml"), tmp_path)
    assert names(files, tmp_path) == ["doc.txt", "step_notes.txt"]


def test_a_file_name_that_is_not_utf8_is_named_in_the_refusal(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "ok.md").write_text("ok")
    with open(os.path.join(os.fsencode(tmp_path), b"notes", b"caf\xe9.md"), "w") as f:
        f.write("x")
    with pytest.raises(DataError, match=r"caf\\xe9\.md.*not UTF-8; rename it"):
        arm_files(arm("notes/*.md"), tmp_path)
