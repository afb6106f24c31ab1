"""Where control sockets live, and that no other local user can take them over (issue 12, item 1).

Real directories with real owners: the tests run as root (as CI does) and hand directories to
another uid with chown; they skip elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import (
    SOCKET_DIR,
    SOCKET_DIR_RECORD,
    SocketDirError,
    bind_endpoint,
    find_socket_dir,
    socket_dir,
)

OTHER_UID = 65534  # nobody

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing a directory to another uid needs root"
)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory of its own under /tmp, in place of pytest's: these tests need
    RUN_DIR/.sock/trainer.sock to fit a unix socket's path (or, for the long run directory, not to),
    wherever pytest keeps its temporary directories (a parallel worker's are longer)."""
    d = Path(tempfile.mkdtemp(prefix="sd-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


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


def _long_run(tmp_path: Path) -> Path:
    """A run directory whose RUN_DIR/.sock/trainer.sock would not fit a unix socket's path."""
    run = tmp_path / ("r" * 120)
    run.mkdir()
    return run


@needs_root
def test_another_user_cannot_pre_empt_the_fallback(tmp_path: Path, monkeypatch) -> None:
    """Issue 24, item 8: the fallback of a run directory too long for a unix socket was
    /tmp/andrea-UID/<hash of the run dir>, a name another local user could create first (the
    trainer then exited 2, for good). Every predictable name is planted here, owned by another
    user; the sockets go to a directory with a random name, recorded in the run directory."""
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    for var in ("XDG_RUNTIME_DIR", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(var, raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.chmod(tmp, 0o1777)  # a /tmp of its own: what is planted here harms no other test
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # $TMPDIR, as gettempdir() read it
    run = _long_run(tmp_path)
    digest = hashlib.sha256(str(run.resolve()).encode()).hexdigest()[:16]
    uid = os.geteuid()
    planted = [
        Path(f"/tmp/andrea-{uid}") / digest,
        tmp / f"andrea-{uid}",
        tmp / f"andrea-{uid}" / digest,
    ]
    try:
        Path(f"/tmp/andrea-{uid}").mkdir(mode=0o700, exist_ok=True)
        for d in planted:
            d.mkdir(exist_ok=True)
            os.chown(d, OTHER_UID, OTHER_UID)
        d = socket_dir(run)
        assert d not in planted and d.parent == tmp and d.name.startswith(f"andrea-{uid}-")
        assert mode(d) == 0o700 and os.stat(d).st_uid == uid
        assert (run / SOCKET_DIR_RECORD).read_text() == f"{d}\n"
        # The other daemon of the run, and every later start, use the recorded directory; a
        # client finds it from the run directory alone.
        assert socket_dir(run) == d and find_socket_dir(run) == d
    finally:
        shutil.rmtree(planted[0], ignore_errors=True)


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A private runtime directory (as /run/user/UID), short enough for a socket path below it."""
    d = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield d
    shutil.rmtree(d)


def test_the_fallback_prefers_the_runtime_directory(
    tmp_path: Path, runtime: Path, monkeypatch
) -> None:
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    run = _long_run(tmp_path)
    d = socket_dir(run)
    assert d.parent == runtime and mode(d) == 0o700
    assert find_socket_dir(run) == d and socket_dir(run) == d


@needs_root
def test_a_recorded_directory_another_user_took_over_is_not_used(
    tmp_path: Path, runtime: Path, monkeypatch
) -> None:
    """After a reboot the recorded random directory is gone, and its name is known: another user
    may create it. The daemons choose a new one; a client refuses the stale record meanwhile."""
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    run = _long_run(tmp_path)
    first = socket_dir(run)
    shutil.rmtree(first)
    first.mkdir()
    os.chown(first, OTHER_UID, OTHER_UID)
    with pytest.raises(SocketDirError, match=f"owned by uid {OTHER_UID}"):
        find_socket_dir(run)
    # The runtime directory's name for this run is taken too: a random one under $TMPDIR.
    monkeypatch.setattr(tempfile, "tempdir", str(runtime))
    second = socket_dir(run)
    assert second != first and second.parent == runtime
    assert os.stat(second).st_uid == os.geteuid() and mode(second) == 0o700
    assert find_socket_dir(run) == second


@pytest.mark.parametrize("runtime_dir", [True, False], ids=["runtime-dir", "tmp"])
def test_a_copied_run_directory_gets_sockets_of_its_own(
    tmp_path: Path, runtime: Path, monkeypatch, runtime_dir: bool
) -> None:
    """A run directory too long for RUN_DIR/.sock, copied with its .socket-dir (cp -a, rsync):
    the copy's record names the original's directory, which must stay the original's, or the two
    trainers would bind one socket and andreactl would stop the wrong one."""
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    if runtime_dir:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    else:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    original = _long_run(tmp_path)
    first = socket_dir(original)
    copy = original.with_name(original.name + "-copy")
    shutil.copytree(original, copy)
    assert (copy / SOCKET_DIR_RECORD).read_text() == f"{first}\n"
    with pytest.raises(SocketDirError, match="the socket directory of another run directory"):
        find_socket_dir(copy)  # before the copy's daemons record theirs: never the original's
    second = socket_dir(copy)
    assert second != first and mode(second) == 0o700
    assert find_socket_dir(copy) == second and find_socket_dir(original) == first
    assert socket_dir(original) == first  # each keeps its own from then on
    assert socket_dir(copy) == second
    shutil.rmtree(second, ignore_errors=True)
    shutil.rmtree(first, ignore_errors=True)


def test_a_socket_a_live_daemon_listens_on_is_never_taken_over(tmp_path: Path, monkeypatch) -> None:
    """Two runs given one $ANDREA_SOCKET_DIR: the second daemon of a role must not bind over the
    first's socket (ZeroMQ would unlink it silently); a stale socket, of a daemon gone, is reused."""
    shared = tmp_path / "sockets"
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(shared))
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    run_a.mkdir()
    run_b.mkdir()
    path = Path(bind_endpoint(run_a, "trainer").removeprefix("ipc://"))
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        live.bind(str(path))
        live.listen()
        with pytest.raises(
            SocketDirError, match=r"another trainer listens there.*ANDREA_SOCKET_DIR"
        ):
            bind_endpoint(run_b, "trainer")
        assert bind_endpoint(run_b, "proxy") == f"ipc://{shared}/proxy.sock"  # another role: free
    finally:
        live.close()
    assert path.exists()  # closed, not unlinked: the socket of a daemon that is gone
    assert bind_endpoint(run_b, "trainer") == f"ipc://{path}"


def test_a_refusal_names_the_variable_that_avoids_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)
    run = shared / "run"
    run.mkdir()
    with pytest.raises(SocketDirError, match="ANDREA_SOCKET_DIR"):
        socket_dir(run)


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


def test_a_record_copied_from_a_live_run_never_leads_to_its_daemons(
    tmp_path: Path, monkeypatch
) -> None:
    """A run directory copied (cp -r) from a live one names the original's sockets in its record
    until its own daemons bind: a client of the copy must not reach the original's meanwhile."""
    monkeypatch.delenv("ANDREA_SOCKET_DIR", raising=False)
    original = tmp_path / "run"
    original.mkdir()
    (original / "run.toml").write_text("")
    first = socket_dir(original)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    assert (copy / SOCKET_DIR_RECORD).read_text() == f"{first}\n"
    assert find_socket_dir(copy) == copy.resolve() / SOCKET_DIR
    assert find_socket_dir(original) == first
    # A directory of that name that is not another run's is a chosen one ($ANDREA_SOCKET_DIR).
    chosen = tmp_path / "sockets" / SOCKET_DIR
    monkeypatch.setenv("ANDREA_SOCKET_DIR", str(chosen))
    assert socket_dir(copy) == chosen and find_socket_dir(copy) == chosen
