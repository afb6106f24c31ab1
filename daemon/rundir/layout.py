"""The map of a run directory: every name the daemons and the tools read or write in it.

A run directory holds (see docs/satellite-files.md and docs/checkpoint-format.md)::

    run.toml                     the run's config as a person wrote it (never rewritten; written
                                 by the trainer's first start only where there is none)
    .run.resolved.toml           the config the run trains under: preset, run.toml and flags
                                 resolved by the trainer, with the changes accepted since
    .run.applied.toml            run.toml byte for byte as .run.resolved.toml last took it in
    policy.toml                  the proxy's mixing policy (optional)
    step_NNNNNN.bin / .json      checkpoint payload and manifest
    .loss.json                   proxy: one entry per trained step
    .eval.json                   proxy: one entry per held-out evaluation
    .samples.json                proxy: recent generated samples
    .state.json                  proxy: bandit state
    .trainer.lock / .proxy.lock  one process per role: its flock, and its pid
    .sock/                       control sockets (unless $ANDREA_SOCKET_DIR says otherwise)
    .socket-dir                  where the control sockets are (written by each daemon)
    archive/pivot-<step>-<utc>/  what a pivot archived, with its pivot.json record
    tensorboard/                 proxy: TensorBoard event files (only with [metrics] tensorboard)

Any new name in a run directory is added here and imported from here. Standard library only, so
that the checkpoint reader and the tools can import it cheaply.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO

from andrea.daemon.rundir.boundedio import LINK_REFUSED, irregular, read_bounded

CONFIG_FILE = "run.toml"
#: The config the run trains under, as its trainer resolved and recorded it (daemon/config.py).
RESOLVED_CONFIG_FILE = ".run.resolved.toml"
#: The person's config file as the resolved config last took it in, byte for byte: a later edit
#: of run.toml is told from it key by key (`config.edits_since`).
APPLIED_CONFIG_FILE = ".run.applied.toml"
POLICY_FILE = "policy.toml"
LOSS_FILE = ".loss.json"
EVAL_FILE = ".eval.json"
SAMPLES_FILE = ".samples.json"
STATE_FILE = ".state.json"
ARCHIVE_DIR = "archive"
#: TensorBoard event files the proxy writes when `[metrics] tensorboard = true`.
TENSORBOARD_DIR = "tensorboard"
PIVOT_RECORD = "pivot.json"

#: The most a checkpoint manifest can need: the layout of the largest preset, the config, every
#: RNG, and the loss records the proxy had not acknowledged (bounded by the assignment lag). A larger
#: file is refused before it is read (a 64 GiB sparse file must not be allocated).
MAX_MANIFEST_BYTES = 16 << 20
#: The most a pivot record (archive/pivot-*/pivot.json) can need: two fingerprints and a few steps.
MAX_PIVOT_RECORD_BYTES = 1 << 20

#: Where the control sockets go when $ANDREA_SOCKET_DIR is unset: RUN_DIR/.sock.
SOCKET_DIR = ".sock"
#: The directory of the run's control sockets, one absolute path. Each daemon writes it when it
#: binds, so that andreactl --run-dir finds sockets that live elsewhere (the units'
#: RuntimeDirectory) without being told.
SOCKET_DIR_RECORD = ".socket-dir"
SOCKET_DIR_ENV = "ANDREA_SOCKET_DIR"
#: Stands in for --run-dir (andreactl, andrea-trainer, andrea-proxy).
RUN_DIR_ENV = "ANDREA_RUN_DIR"
#: How long `claim` tries a lock found taken again, before taking it for another daemon's.
_CLAIM_PATIENCE_S = 0.5
#: sun_path holds 108 bytes; keep a margin for the socket's own name.
_MAX_IPC_PATH = 100
#: The most RUN_DIR/.socket-dir may hold: one path.
_MAX_RECORD = 4096

#: Temporaries a checkpoint write leaves behind when it is killed (see durable.tmp_path).
CHECKPOINT_TEMPORARIES = "step_*.tmp"
_CHECKPOINT_NAME = re.compile(r"^step_(\d{6,})\.(bin|json)$")


class AlreadyRunning(RuntimeError):
    """Another process of the same role holds this run directory."""


def checkpoint_stem(step: int) -> str:
    """`step_NNNNNN`: the step zero-padded to at least six digits."""
    return f"step_{step:06d}"


def bin_name(step: int) -> str:
    return f"{checkpoint_stem(step)}.bin"


def manifest_name(step: int) -> str:
    return f"{checkpoint_stem(step)}.json"


def parse_checkpoint_name(name: str) -> tuple[int, str] | None:
    """(step, "bin"|"json") for a checkpoint file name, None for anything else: a name the trainer
    would not write (`step_0000030.json`, a step padded past six digits) is not a checkpoint."""
    m = _CHECKPOINT_NAME.match(name)
    if m is None or name != f"{checkpoint_stem(int(m.group(1)))}.{m.group(2)}":
        return None
    return int(m.group(1)), m.group(2)


def is_run_file(name: str) -> bool:
    """Whether a file of this name directly in a run directory is the run's own (its config,
    policy, checkpoints, their temporaries, the daemons' dot files), never data."""
    return (
        name in (CONFIG_FILE, POLICY_FILE)
        or name.startswith(".")
        or parse_checkpoint_name(name) is not None
        or fnmatchcase(name, CHECKPOINT_TEMPORARIES)
    )


def corrupt_name(name: str, when: int) -> str:
    """Where an unreadable satellite file is moved aside (`NAME.corrupt-<unix time>`)."""
    return f"{name}.corrupt-{when}"


def pivot_archive(run_dir: Path, boundary: int, stamp: str) -> Path:
    """The archive directory of a pivot at `boundary`, made at UTC `stamp` (%Y%m%dT%H%M%SZ)."""
    return run_dir / ARCHIVE_DIR / f"pivot-{boundary:06d}-{stamp}"


def pivot_records(run_dir: Path) -> Iterator[Path]:
    """Every pivot.json under archive/, in no particular order."""
    return run_dir.glob(f"{ARCHIVE_DIR}/pivot-*/{PIVOT_RECORD}")


def recorded_config(run_dir: Path) -> Path | None:
    """The file of the config the run trains under: RESOLVED_CONFIG_FILE; in a run directory of
    an earlier version (none), its run.toml, which that trainer rewrote into the resolved config.
    None where neither exists (before a first start). What every reader of a run's config reads
    (the proxy, andreactl plan, export, verify-resume); run.toml is the person's."""
    for name in (RESOLVED_CONFIG_FILE, CONFIG_FILE):
        if (run_dir / name).is_file():
            return run_dir / name
    return None


def is_run_dir(path: Path) -> bool:
    """Whether `path` holds a run: its config, its loss log or a checkpoint's manifest (a
    trainer records its config before anything else)."""
    if recorded_config(path) is not None or (path / LOSS_FILE).is_file():
        return True
    return any(parse_checkpoint_name(p.name) for p in path.glob("step_*.json"))


def lock_path(run_dir: Path, role: str) -> Path:
    return run_dir / f".{role}.lock"


def claim(run_dir: Path, role: str) -> IO[bytes]:
    """Hold `RUN_DIR/.ROLE.lock` for the life of the process: two trainers (or two proxies) on one
    run directory would interleave checkpoints and steal each other's socket. The lock is opened
    where it lies: truncated and written through a planted link, it would empty any file the daemon
    can write (OSError, as for a run directory it cannot write)."""
    path = lock_path(run_dir, role)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(
                e.errno, f"not a regular file (a symbolic link; {LINK_REFUSED})", str(path)
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        kind = irregular(path)
        os.close(fd)
        raise OSError(errno.EINVAL, f"not a regular file ({kind})", str(path))
    f = os.fdopen(fd, "r+b")
    if not _flock_soon(f):
        f.seek(0)
        holder = f.read().decode(errors="replace").strip() or "?"
        f.close()
        raise AlreadyRunning(f"another andrea-{role} (pid {holder}) is running on {run_dir}")
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()).encode())
    f.flush()
    return f


def _flock_soon(f: IO[bytes]) -> bool:
    """Take `f`'s exclusive flock, or False when another process holds it. A lock found taken is
    tried again for _CLAIM_PATIENCE_S: a probe (`lock_holder`, `andreactl status`) holds it shared
    for an instant, and a daemon starting just then must not take that for another daemon."""
    deadline = time.monotonic() + _CLAIM_PATIENCE_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def lock_holder(run_dir: Path, role: str) -> int | None:
    """The pid of the process that holds `role`'s lock of `run_dir` now: its flock, with the pid
    it wrote. None when no process holds it — whatever pid the file names: one that exited, or
    the live process of another run directory whose lock file was copied here (`cp -r` copies the
    pid, never the flock). Probes the lock shared for an instant (`claim` allows for that), never
    creates it, never blocks."""
    held = _held(run_dir, role)
    return held[0] if held is not None else None


def _held(run_dir: Path, role: str) -> tuple[int, int] | None:
    """(pid, inode) of `role`'s lock file while a process holds its flock and has written its pid."""
    try:
        fd = os.open(
            lock_path(run_dir, role), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it
        except BlockingIOError:
            pass
        try:
            pid = int(os.pread(fd, 32, 0).decode("ascii").strip())
        except (OSError, ValueError):
            return None  # held, but its holder has not written its pid yet
        return (pid, st.st_ino) if pid > 0 else None
    finally:
        os.close(fd)  # releases the probe's lock


#: The module each daemon runs as under `python -m` (its command line when started that way).
DAEMON_MODULES = {
    "trainer": "andrea.daemon.trainer.service.cli",
    "proxy": "andrea.daemon.mixing.cli",
}


def signal_holder(run_dir: Path, role: str, pid: int, sig: signal.Signals) -> bool:
    """Send `sig` to `pid` only while it holds `role`'s lock of `run_dir`: the lock is held, names
    `pid`, and the kernel's table of locks (/proc/locks, in this process's pid namespace) shows
    `pid` holding a flock on that very file (its inode). The process is pinned (a pidfd) before
    it is checked, so a pid reused meanwhile is never signalled. False, sending nothing, when any
    of it is not so, or cannot be checked (no /proc/locks, another pid namespace)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False  # no such process
    try:
        if not _holds(run_dir, role, pid):
            return False
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return False  # it exited after the check: nothing to signal
    finally:
        os.close(pidfd)
    return True


def _holds(run_dir: Path, role: str, pid: int) -> bool:
    """Whether `pid` holds `role`'s lock of `run_dir`, as the lock and the kernel both say."""
    held = _held(run_dir, role)
    if held is None or held[0] != pid:
        return False
    try:
        table = Path("/proc/locks").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 8043 fe:00:2147059 0 EOF"; a waiter's line has "->" second.
        # The device is left out: /proc/locks prints the superblock's, which differs from stat's
        # on btrfs subvolumes. The inode and the pid together name the lock.
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4] == str(pid):
            if fields[5].rsplit(":", 1)[-1] == str(held[1]):
                return True
    return False


class SocketDirError(RuntimeError):
    """The socket directory, or a directory on its path, could let another user in."""


def _own_uid() -> int:
    return os.geteuid()


def _check_dir(d: Path, owner: int) -> None:
    """`d` and every directory above it: a real directory, owned by `owner` (or root above the
    socket directory itself), writable by no one else. A root-owned sticky directory (/tmp) may
    be world-writable: nobody else can rename or remove what is in it."""
    for i, part in enumerate([d, *d.parents]):
        try:
            st = os.lstat(part)
        except FileNotFoundError:
            raise SocketDirError(f"socket directory {part} does not exist") from None
        if not stat.S_ISDIR(st.st_mode):
            raise SocketDirError(
                f"{part} is not a directory (a symlink?): refusing it on the socket path"
            )
        trusted = {owner} if i == 0 else {owner, 0}
        if st.st_uid not in trusted:
            raise SocketDirError(
                f"{part} is owned by uid {st.st_uid}, not by uid {owner}"
                + ("" if i == 0 else " or root")
                + ": another user could replace the control sockets; refusing it"
            )
        sticky = st.st_mode & stat.S_ISVTX and st.st_uid == 0 and i > 0
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky:
            raise SocketDirError(
                f"{part} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}):"
                " another user could replace the control sockets; refusing it"
            )


def _private_dir(d: Path) -> None:
    """Create `d` owner-only, or accept an existing one only if it is ours and nobody else's."""
    try:
        d.mkdir(mode=0o700)
    except FileExistsError:
        pass
    _check_dir(d, _own_uid())
    os.chmod(d, 0o700)


def _fits(d: Path) -> bool:
    # sun_path counts bytes: a non-ASCII path is longer than its characters.
    return len(os.fsencode(d)) + len(b"/trainer.sock") <= _MAX_IPC_PATH


def _runtime_bases() -> list[Path]:
    """The user's private runtime directories, where a socket directory cannot be pre-empted: the
    unit's RuntimeDirectory (systemd sets $RUNTIME_DIRECTORY), then $XDG_RUNTIME_DIR."""
    bases = []
    for var in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"):
        first = os.environ.get(var, "").split(":")[0]
        if os.path.isabs(first):
            bases.append(Path(first))
    return bases


def _usable(d: Path) -> bool:
    """Whether `d` can hold this user's sockets as it is: a short, owner-only directory of ours
    (created here if its parent is private)."""
    if not _fits(d):
        return False
    try:
        _private_dir(d)
    except (SocketDirError, OSError):
        return False
    return True


def _fallback_dir(run_dir: Path) -> Path:
    """Where the sockets go when RUN_DIR/.sock is too long for a unix socket: the recorded
    directory if it is still ours, else one in a private runtime directory, else a new directory
    with a random name under the temporary directory (mkdtemp: owner-only, never a name another
    user could create first). The caller records it."""
    recorded = _read_record(run_dir)
    if recorded is not None and _usable(recorded) and _serves(recorded, run_dir):
        return recorded
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    d: Path | None = None
    for base in _runtime_bases():
        try:
            _check_dir(base, _own_uid())
        except SocketDirError:
            continue
        if _usable(base / f"andrea-{digest}"):
            d = base / f"andrea-{digest}"
            break
    if d is None:
        d = Path(tempfile.mkdtemp(prefix=f"andrea-{_own_uid()}-"))
        _check_dir(d, _own_uid())
    (d / _OWNER_FILE).write_text(f"{run_dir.resolve()}\n", encoding="utf-8")
    return d


#: In a fallback socket directory: the run directory it serves. A run directory copied with its
#: .socket-dir names the original's directory, whose sockets must stay the original's.
_OWNER_FILE = "run-dir"


def _serves(d: Path, run_dir: Path) -> bool:
    try:
        owner = read_bounded(d / _OWNER_FILE, _MAX_RECORD).decode().strip()
    except (OSError, ValueError):
        return False
    return owner == str(run_dir.resolve())


def _read_record(run_dir: Path) -> Path | None:
    """The socket directory recorded in RUN_DIR/.socket-dir: a small regular file (never read
    through a link) holding an absolute path; None when there is none or it is not one."""
    try:
        d = Path(read_bounded(run_dir / SOCKET_DIR_RECORD, _MAX_RECORD).decode().strip())
    except (OSError, ValueError):
        return None
    return d if d.is_absolute() else None


def _write_record(run_dir: Path, d: Path) -> None:
    if _read_record(run_dir) == d:
        return
    # A new file of a random name (never through a link planted at a name known in advance),
    # then renamed over the record.
    fd, tmp = tempfile.mkstemp(prefix=f"{SOCKET_DIR_RECORD}.", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{d}\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, run_dir / SOCKET_DIR_RECORD)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _run_dir_locked(run_dir: Path) -> Iterator[None]:
    """The run directory's own flock: the trainer and its proxy, starting together, settle on one
    socket directory (the second finds the first one's record)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_AVOID = (
    f"; set {SOCKET_DIR_ENV} to a directory only you can write (the units set it to their "
    "RuntimeDirectory)"
)


def socket_dir(run_dir: Path) -> Path:
    """For a daemon: the directory of the run's control sockets, created owner-only, checked, and
    recorded in RUN_DIR/.socket-dir.

    $ANDREA_SOCKET_DIR wins (the units point it at the RuntimeDirectory); otherwise RUN_DIR/.sock,
    or, when that path is too long for a unix socket, a directory no other user can pre-empt
    (:func:`_fallback_dir`). Raises SocketDirError when a directory on the path is not owned by
    this user (or root, above the socket directory) or is writable by others; the message names
    $ANDREA_SOCKET_DIR, the way around it.
    """
    given = os.environ.get(SOCKET_DIR_ENV)
    try:
        with _run_dir_locked(run_dir):
            if given:
                d = Path(os.path.abspath(given))
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                _private_dir(d)
            elif _fits(run_dir.resolve() / SOCKET_DIR):
                d = run_dir.resolve() / SOCKET_DIR
                _private_dir(d)
            else:
                d = _fallback_dir(run_dir)
            _write_record(run_dir, d)
    except SocketDirError as e:
        if given:
            raise SocketDirError(f"${SOCKET_DIR_ENV}={given}: {e}") from None
        raise SocketDirError(f"{e}{_AVOID}") from None
    return d


def find_socket_dir(run_dir: Path) -> Path:
    """For a client: where the daemons of `run_dir` have their sockets, from RUN_DIR/.socket-dir
    (else the default place), checked as the daemons check it: owned by the run directory's owner
    and writable by nobody else. Raises SocketDirError."""
    try:
        owner = os.stat(run_dir).st_uid
    except FileNotFoundError:
        owner = _own_uid()  # nothing runs there; the caller finds no daemon
    record = run_dir / SOCKET_DIR_RECORD
    try:
        st = os.lstat(record)
    except FileNotFoundError:
        d = run_dir.resolve() / SOCKET_DIR
    else:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_size > _MAX_RECORD:
            raise SocketDirError(f"{record} is not a small regular file owned by uid {owner}")
        try:
            d = Path(read_bounded(record, _MAX_RECORD).decode().strip())
        except ValueError as e:
            raise SocketDirError(f"{record}: {e}") from None
        if not d.is_absolute():
            raise SocketDirError(f"{record} does not hold an absolute path: {str(d)!r}")
        d = _own_record(run_dir, d)
    if d.exists():
        _check_dir(d, owner)
    return d


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _own_record(run_dir: Path, d: Path) -> Path:
    """The recorded socket directory `d`, unless it is another run directory's: a run directory
    copied from a live one (`cp -r`) carries the original's record until its own daemons bind, and
    a client must never reach the original's daemons through it (`andreactl --run-dir COPY stop`
    would stop the original). The copy's own default directory then, where its daemons will bind;
    SocketDirError for a copied fallback directory, whose own one is not known yet."""
    if d.name == SOCKET_DIR and is_run_dir(d.parent) and not _same_dir(d.parent, run_dir):
        return run_dir.resolve() / SOCKET_DIR
    if (d / _OWNER_FILE).exists() and not _serves(d, run_dir):
        raise SocketDirError(
            f"{run_dir / SOCKET_DIR_RECORD} names {d}, the socket directory of another run "
            "directory (this one copied from it?): its daemons have not recorded theirs yet; "
            "try again in a moment"
        )
    return d


def endpoint(run_dir: Path, role: str) -> str:
    """The ZeroMQ endpoint of a `role` daemon ("trainer" or "proxy") of the run (creates and
    records the socket directory)."""
    return f"ipc://{socket_dir(run_dir)}/{role}.sock"


def bind_endpoint(run_dir: Path, role: str) -> str:
    """`endpoint`, for the daemon about to bind it. SocketDirError when a live daemon already
    listens there: binding would take its socket over (two runs given one $ANDREA_SOCKET_DIR), and
    its clients would reach this one."""
    address = endpoint(run_dir, role)
    path = Path(address.removeprefix("ipc://"))
    if _listening(path):
        raise SocketDirError(
            f"{path}: another {role} listens there (another run with the same socket directory?)"
            f"{_AVOID}, one per run"
        )
    return address


def _listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket `path` (a stale one refuses)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)  # a full backlog blocks a connect: a daemon too busy to accept is alive
    try:
        probe.connect(os.fsencode(path))
    except TimeoutError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return True


def peer_endpoint(run_dir: Path, role: str) -> str:
    """The endpoint of the run's `role` daemon for a client, wherever its sockets live."""
    return f"ipc://{find_socket_dir(run_dir)}/{role}.sock"
