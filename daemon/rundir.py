"""The map of a run directory: every name the daemons and the tools read or write in it.

A run directory holds (see docs/satellite-files.md and docs/checkpoint-format.md)::

    run.toml                     the run's config (written by the trainer's first start)
    policy.toml                  the proxy's mixing policy (optional)
    step_NNNNNN.bin / .json      checkpoint payload and manifest
    .loss.json                   proxy: one entry per trained step
    .eval.json                   proxy: one entry per held-out evaluation
    .samples.json                proxy: recent generated samples
    .state.json                  proxy: bandit state
    .trainer.lock / .proxy.lock  one process per role, holding the pid
    .sock/                       control sockets (unless $ANDREA_SOCKET_DIR says otherwise)
    .socket-dir                  where the control sockets are (written by each daemon)
    archive/pivot-<step>-<utc>/  what a pivot archived, with its pivot.json record
    tensorboard/                 proxy: TensorBoard event files (only with [metrics] tensorboard)

Any new name in a run directory is added here and imported from here. Standard library only, so
that the checkpoint reader and the tools can import it cheaply.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CONFIG_FILE = "run.toml"
POLICY_FILE = "policy.toml"
LOSS_FILE = ".loss.json"
EVAL_FILE = ".eval.json"
SAMPLES_FILE = ".samples.json"
STATE_FILE = ".state.json"
ARCHIVE_DIR = "archive"
#: TensorBoard event files the proxy writes when `[metrics] tensorboard = true`.
TENSORBOARD_DIR = "tensorboard"
PIVOT_RECORD = "pivot.json"

#: Where the control sockets go when $ANDREA_SOCKET_DIR is unset: RUN_DIR/.sock.
SOCKET_DIR = ".sock"
#: The directory of the run's control sockets, one absolute path. Each daemon writes it when it
#: binds, so that andreactl --run-dir finds sockets that live elsewhere (the units'
#: RuntimeDirectory) without being told.
SOCKET_DIR_RECORD = ".socket-dir"
SOCKET_DIR_ENV = "ANDREA_SOCKET_DIR"
#: sun_path holds 108 bytes; keep a margin for the socket's own name.
_MAX_IPC_PATH = 100

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
    """(step, "bin"|"json") for a checkpoint file name, None for anything else."""
    m = _CHECKPOINT_NAME.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def corrupt_name(name: str, when: int) -> str:
    """Where an unreadable satellite file is moved aside (`NAME.corrupt-<unix time>`)."""
    return f"{name}.corrupt-{when}"


def pivot_archive(run_dir: Path, boundary: int, stamp: str) -> Path:
    """The archive directory of a pivot at `boundary`, made at UTC `stamp` (%Y%m%dT%H%M%SZ)."""
    return run_dir / ARCHIVE_DIR / f"pivot-{boundary:06d}-{stamp}"


def pivot_records(run_dir: Path) -> Iterator[Path]:
    """Every pivot.json under archive/, in no particular order."""
    return run_dir.glob(f"{ARCHIVE_DIR}/pivot-*/{PIVOT_RECORD}")


def lock_path(run_dir: Path, role: str) -> Path:
    return run_dir / f".{role}.lock"


def claim(run_dir: Path, role: str) -> IO[bytes]:
    """Hold `RUN_DIR/.ROLE.lock` for the life of the process: two trainers (or two proxies) on one
    run directory would interleave checkpoints and steal each other's socket."""
    f = open(lock_path(run_dir, role), "a+b")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().decode(errors="replace").strip() or "?"
        f.close()
        raise AlreadyRunning(
            f"another andrea-{role} (pid {holder}) is running on {run_dir}"
        ) from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()).encode())
    f.flush()
    return f


def lock_holder(run_dir: Path, role: str) -> int | None:
    """The pid `role`'s lock names: the last process that claimed it (which may have exited since
    and released it). None without a readable lock file. Never creates, locks or blocks on it."""
    try:
        fd = os.open(lock_path(run_dir, role), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        text = os.read(fd, 32) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    finally:
        os.close(fd)
    try:
        pid = int(text.decode("ascii").strip())
    except ValueError:
        return None
    return pid if pid > 0 else None


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


def _default_socket_dir(run_dir: Path, uid: int) -> Path:
    d = run_dir.resolve() / SOCKET_DIR
    # sun_path counts bytes: a non-ASCII path is longer than its characters.
    if len(os.fsencode(d)) + len(b"/trainer.sock") <= _MAX_IPC_PATH:
        return d
    # Too long for sun_path: a per-run directory under a private parent, as ssh-agent does.
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return Path(f"/tmp/andrea-{uid}") / digest


def socket_dir(run_dir: Path) -> Path:
    """For a daemon: the directory of the run's control sockets, created owner-only, checked, and
    recorded in RUN_DIR/.socket-dir.

    $ANDREA_SOCKET_DIR wins (the units point it at the RuntimeDirectory); otherwise RUN_DIR/.sock,
    or /tmp/andrea-UID/<hash of the run dir> when that path is too long for a unix socket. Raises
    SocketDirError when a directory on the path is not owned by this user (or root, above the
    socket directory) or is writable by others.
    """
    if os.environ.get(SOCKET_DIR_ENV):
        d = Path(os.path.abspath(os.environ[SOCKET_DIR_ENV]))
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        d = _default_socket_dir(run_dir, _own_uid())
        if d.parent.name == f"andrea-{_own_uid()}":
            _private_dir(d.parent)
    _private_dir(d)
    record = run_dir / SOCKET_DIR_RECORD
    if not record.exists() or record.read_text().strip() != str(d):
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        tmp.write_text(f"{d}\n")
        os.replace(tmp, record)
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
        d = _default_socket_dir(run_dir, owner)
    else:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_size > 4096:
            raise SocketDirError(f"{record} is not a small regular file owned by uid {owner}")
        d = Path(record.read_text().strip())
        if not d.is_absolute():
            raise SocketDirError(f"{record} does not hold an absolute path: {str(d)!r}")
    if d.exists():
        _check_dir(d, owner)
    return d


def endpoint(run_dir: Path, role: str) -> str:
    """The ZeroMQ endpoint a `role` daemon ("trainer" or "proxy") binds (creates and records the
    socket directory)."""
    return f"ipc://{socket_dir(run_dir)}/{role}.sock"


def peer_endpoint(run_dir: Path, role: str) -> str:
    """The endpoint of the run's `role` daemon for a client, wherever its sockets live."""
    return f"ipc://{find_socket_dir(run_dir)}/{role}.sock"
