"""The bounded reads of run-directory files (daemon/rundir/boundedio.py): a link anywhere below the run
directory is refused, never followed, and so is anything but a regular file; a FIFO never blocks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from andrea.daemon.rundir.boundedio import (
    FileRejected,
    irregular,
    read_bounded,
    read_inside,
    regular_size,
)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A 0600 file outside the run directory: what a planted link points at."""
    path = tmp_path / "secret"
    path.write_text("root:$6$hash:19000:0:99999:7:::\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    return d


def test_a_linked_file_is_refused_not_followed(run: Path, secret: Path) -> None:
    (run / "policy.toml").symlink_to(secret)
    with pytest.raises(FileRejected, match=r"policy\.toml: not a regular file \(a symbolic link"):
        read_bounded(run / "policy.toml", 1 << 20)
    with pytest.raises(FileRejected, match="a symbolic link"):
        regular_size(run / "policy.toml")
    assert irregular(run / "policy.toml") == "a symbolic link"
    # A file a person names may be a link: its target is read, still bounded.
    assert read_bounded(run / "policy.toml", 1 << 20, follow_symlinks=True).startswith(b"root:")


def test_a_fifo_is_refused_without_blocking(run: Path) -> None:
    os.mkfifo(run / ".samples.json")
    with pytest.raises(FileRejected, match=r"not a regular file \(a FIFO\)"):
        read_bounded(run / ".samples.json", 1 << 20)
    with pytest.raises(FileRejected, match="a FIFO"):
        read_bounded(run / ".samples.json", 1 << 20, follow_symlinks=True)
    assert irregular(run / ".samples.json") == "a FIFO"


def test_a_link_to_a_device_and_a_sparse_file(run: Path) -> None:
    (run / "run.toml").symlink_to("/dev/zero")
    with pytest.raises(FileRejected, match=r"not a regular file \(a character device\)"):
        read_bounded(run / "run.toml", 1 << 20, follow_symlinks=True)
    with open(run / "big", "wb") as f:
        f.truncate(64 << 30)
    with pytest.raises(FileRejected, match="68,719,476,736 bytes, more than the 1,048,576"):
        read_bounded(run / "big", 1 << 20)


def test_nested_files_are_reached_without_following_a_directory_link(
    run: Path, tmp_path: Path, secret: Path
) -> None:
    real = run / "archive" / "pivot-000010-20250101T000000Z"
    real.mkdir(parents=True)
    (real / "pivot.json").write_text('{"boundary_step": 10}')
    assert read_inside(run, "archive/pivot-000010-20250101T000000Z/pivot.json", 4096).startswith(
        b"{"
    )

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "pivot.json").symlink_to(secret)
    (run / "archive" / "pivot-000020-x").symlink_to(outside)
    with pytest.raises(FileRejected, match=r"pivot-000020-x: not a directory \(a symbolic link\)"):
        read_inside(run, "archive/pivot-000020-x/pivot.json", 4096)

    (real / "policy.toml").symlink_to(secret)
    with pytest.raises(FileRejected, match=r"pivot-000010-20250101T000000Z/policy\.toml: not a"):
        read_inside(run, "archive/pivot-000010-20250101T000000Z/policy.toml", 4096)
    with pytest.raises(ValueError, match="not a path inside"):
        read_inside(run, "../secret", 4096)


def test_a_lock_planted_as_a_link_is_refused_and_its_target_left_alone(
    run: Path, secret: Path
) -> None:
    """A daemon truncates its lock and writes its pid there: through a planted link, a root
    daemon would have emptied the file it points at."""
    from andrea.daemon.rundir.layout import claim

    before = secret.read_bytes()
    (run / ".trainer.lock").symlink_to(secret)
    with pytest.raises(OSError, match="symbolic link"):
        claim(run, "trainer")
    assert secret.read_bytes() == before
    (run / ".trainer.lock").unlink()
    os.mkfifo(run / ".trainer.lock")
    with pytest.raises(OSError, match="a FIFO"):
        claim(run, "trainer")


def test_writers_never_write_through_a_planted_link(run: Path, secret: Path) -> None:
    """Every file a daemon writes in a run directory: the loss log it appends to, the temporary
    of an atomic write (its name, NAME.PID.tmp, is known in advance) and the payload's temporary.
    A link planted at any of them is refused; what it points at is left alone."""
    import numpy as np

    from andrea.daemon.checkpoint.writer import write_payload
    from andrea.daemon.rundir.durable import atomic_write_bytes, tmp_path
    from andrea.daemon.rundir.losslog import LossLog, LossLogCorrupt

    before = secret.read_bytes()
    (run / ".loss.json").symlink_to(secret)
    with pytest.raises(LossLogCorrupt, match="symbolic link"):
        LossLog.open(run / ".loss.json")
    tmp_path(run / ".state.json").symlink_to(secret)
    with pytest.raises(OSError):
        atomic_write_bytes(run / ".state.json", b"{}")
    tmp_path(run / "step_000010.bin").symlink_to(secret)
    with pytest.raises(OSError):
        write_payload(run / "step_000010.bin", np.zeros(4, dtype=np.uint8))
    assert secret.read_bytes() == before
    assert not (run / ".state.json").exists() and not (run / "step_000010.bin").exists()
