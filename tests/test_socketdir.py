"""Where control sockets live, and that no other local user can take them over (issue 12, item 1).

Real directories with real owners: the tests run as root (as CI does) and hand directories to
another uid with chown; they skip elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from andrea.daemon.rundir import (
    SOCKET_DIR_RECORD,
    SocketDirError,
    find_socket_dir,
    socket_dir,
)

OTHER_UID = 65534  # nobody

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing a directory to another uid needs root"
)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_default_is_owner_only_inside_the_run_dir_and_recorded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    d = socket_dir(tmp_path)
    assert d == tmp_path.resolve() / ".sock" and mode(d) == 0o700
    assert (tmp_path / SOCKET_DIR_RECORD).read_text() == f"{d}\n"
    assert find_socket_dir(tmp_path) == d


def test_clients_find_sockets_elsewhere_without_the_variable(tmp_path: Path, monkeypatch) -> None:
    run, elsewhere = tmp_path / "run", tmp_path / "runtime" / "andrea" / "r1"
    run.mkdir()
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(elsewhere))
    assert socket_dir(run) == elsewhere and mode(elsewhere) == 0o700
    monkeypatch.delenv("ANDREA_SOCKET_DIR")
    assert find_socket_dir(run) == elsewhere


def test_an_existing_directory_of_ours_is_tightened(tmp_path: Path, monkeypatch) -> None:
    d = tmp_path / "s"
    d.mkdir(mode=0o755)
    os.chmod(d, 0o755)
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(d))
    socket_dir(tmp_path)
    assert mode(d) == 0o700


@pytest.mark.parametrize("bad_mode", [0o777, 0o770, 0o722])
def test_a_socket_dir_writable_by_others_is_refused(tmp_path: Path, monkeypatch, bad_mode) -> None:
    d = tmp_path / "s"
    d.mkdir()
    os.chmod(d, bad_mode)
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(d))
    with pytest.raises(SocketDirError, match=f"{d} is writable by other users"):
        socket_dir(tmp_path)
    assert mode(d) == bad_mode  # refused, not "repaired": someone may already have planted a socket


def test_a_parent_writable_by_others_is_refused(tmp_path: Path, monkeypatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)  # group-writable, no sticky bit: a group member can rename our dir
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(shared / "mine"))
    with pytest.raises(SocketDirError, match=f"{shared} is writable by other users"):
        socket_dir(tmp_path)


def test_a_symlink_on_the_path_is_refused(tmp_path: Path, monkeypatch) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(tmp_path / "link"))
    with pytest.raises(SocketDirError, match="not a directory"):
        socket_dir(tmp_path)


@needs_root
def test_a_socket_dir_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch) -> None:
    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    os.chown(d, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(d))
    with pytest.raises(SocketDirError, match=f"{d} is owned by uid {OTHER_UID}"):
        socket_dir(tmp_path)


@needs_root
def test_a_pre_created_fallback_directory_is_refused(tmp_path: Path, monkeypatch) -> None:
    """The attack of issue 12: a run directory too long for a unix socket puts the sockets under
    /tmp/andrea-UID/<hash>; another user creates that hash directory first."""
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    run = tmp_path / ("r" * 120)
    run.mkdir()
    digest = hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:16]
    parent = Path(f"/tmp/andrea-{os.geteuid()}")
    parent.mkdir(mode=0o700, exist_ok=True)
    planted = parent / digest
    planted.mkdir()
    try:
        os.chown(planted, OTHER_UID, OTHER_UID)
        with pytest.raises(SocketDirError, match=f"{planted} is owned by uid {OTHER_UID}"):
            socket_dir(run)
    finally:
        shutil.rmtree(planted)
    # Without the planted directory the fallback works, under an owner-only parent.
    d = socket_dir(run)
    try:
        assert d == planted and mode(d) == 0o700 and mode(parent) == 0o700
    finally:
        d.rmdir()


@needs_root
def test_clients_refuse_a_record_they_cannot_trust(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    record = tmp_path / SOCKET_DIR_RECORD
    record.write_text("relative/path\n")
    with pytest.raises(SocketDirError, match="absolute path"):
        find_socket_dir(tmp_path)
    record.write_text(f"{tmp_path / 'x'}\n")
    os.chown(record, OTHER_UID, OTHER_UID)
    with pytest.raises(SocketDirError, match="owned by uid 0"):
        find_socket_dir(tmp_path)
