"""Links among an arm's files: one that leaves the arm's directory and the run's is refused (exit 2)
before a byte of its target is read, by the trainer, `andreactl tokenizer train` and `encode`; one
that stays inside is followed; `links = "follow"` follows any, on purpose. The secret behind a
planted link (a real symlink to a 0600 file) never reaches tokenizer.json or the token cache."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.daemon.config import ArmSpec
from andrea.daemon.data.sources import SourceRejected, arm_roots, read_file
from tests.support.links import SECRET, linked_run, unread
from tests.support.owndata import PROSE


def _atime_kept(where: Path) -> bool:
    """Whether this filesystem records a read in the access time (relatime does, once it is older
    than the modification time): the oracle of "never read"."""
    probe = where / "atime-probe"
    probe.write_text("x")
    os.utime(probe, (0, probe.stat().st_mtime))
    probe.read_text()
    return probe.stat().st_atime != 0


def _ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = andreactl.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


def test_tokenizer_train_refuses_a_link_out_of_the_arm(tmp_path: Path, capsys) -> None:
    run = linked_run(tmp_path)
    code, err = _ctl(capsys, "tokenizer", "train", "--run-dir", str(run), "--vocab-size", "300")
    assert code == 2, err
    assert f"arm 'notes': {run}/notes/zz.md leads to {tmp_path}/secret.txt through a link" in err
    assert 'set links = "follow" on the arm in run.toml' in err
    assert not (run / "tokenizer.json").exists()
    assert unread(tmp_path / "secret.txt"), "the link's target was read"


def test_a_link_inside_the_run_is_followed_and_follow_reads_any(tmp_path: Path, capsys) -> None:
    run = linked_run(tmp_path)
    (run / "notes" / "zz.md").unlink()
    (run / "shared").mkdir()
    (run / "shared" / "b.md").write_text(PROSE)
    (run / "notes" / "zz.md").symlink_to(
        run / "shared" / "b.md"
    )  # inside the run: a corpus of links
    code, err = _ctl(capsys, "tokenizer", "train", "--run-dir", str(run), "--vocab-size", "300")
    assert code == 0, err
    # Data kept behind links on purpose: the arm says so.
    run = linked_run(tmp_path / "follow", links="follow")
    code, err = _ctl(capsys, "tokenizer", "train", "--run-dir", str(run), "--vocab-size", "400")
    assert code == 0, err
    if _atime_kept(tmp_path):
        assert not unread(tmp_path / "follow" / "secret.txt"), "followed on purpose"


def test_encode_refuses_a_globbed_link_out_of_its_directory(tmp_path: Path, capsys) -> None:
    run = linked_run(tmp_path)
    out = tmp_path / "out.u8"
    argv = ["tokenizer", "encode", "--tokenizer", "bytes", "--out", str(out)]
    code, err = _ctl(capsys, *argv, "--input", str(run / "notes" / "*.md"))
    assert code == 2, err
    assert "zz.md leads to" in err and "--follow-links" in err
    assert not out.exists() and unread(tmp_path / "secret.txt")
    # Named in full, a link is the person's to name; --follow-links reads a glob's.
    assert _ctl(capsys, *argv, "--input", str(run / "notes" / "zz.md"))[0] == 0
    out.unlink()
    out.with_name("out.u8.json").unlink()
    assert _ctl(capsys, *argv, "--follow-links", "--input", str(run / "notes" / "*.md"))[0] == 0


def test_a_link_swapped_in_after_the_listing_is_refused_on_the_descriptor(tmp_path: Path) -> None:
    run = linked_run(tmp_path)
    spec = ArmSpec(name="notes", kind="text", paths=["notes/*.md"])
    roots = arm_roots(spec, run)
    assert read_file(run / "notes" / "n0.md", roots) == (PROSE * 30).encode()
    with pytest.raises(SourceRejected, match="through a link"):
        read_file(run / "notes" / "zz.md", roots)
    # A directory link on the way counts the same.
    (run / "notes" / "n0.md").unlink()
    (run / "notes" / "sub").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(SourceRejected, match="through a link"):
        read_file(run / "notes" / "sub" / "secret.txt", roots)
    assert read_file(run / "notes" / "zz.md", None) == SECRET.encode(), "links = follow"
