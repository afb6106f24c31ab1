"""The map of a run directory: every name the daemons and the tools read or write in it.

A run directory holds (see docs/satellite-files.md and docs/checkpoint-format.md)::

    run.toml                     the run's config (written by the trainer's first start)
    policy.toml                  the proxy's mixing policy (optional)
    step_NNNNNN.bin / .json      checkpoint payload and manifest
    .loss.json                   proxy: one entry per trained step
    .samples.json                proxy: recent generated samples
    .state.json                  proxy: bandit state
    .trainer.lock / .proxy.lock  one process per role, holding the pid
    .sock/                       control sockets (unless $ANDREA_SOCKET_DIR says otherwise)
    archive/pivot-<step>-<utc>/  what a pivot archived, with its pivot.json record

Any new name in a run directory is added here and imported from here. Standard library only, so
that the checkpoint reader and the tools can import it cheaply.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO

CONFIG_FILE = "run.toml"
POLICY_FILE = "policy.toml"
LOSS_FILE = ".loss.json"
SAMPLES_FILE = ".samples.json"
STATE_FILE = ".state.json"
ARCHIVE_DIR = "archive"
PIVOT_RECORD = "pivot.json"

#: Where the control sockets go when $ANDREA_SOCKET_DIR is unset: RUN_DIR/.sock.
SOCKET_DIR = ".sock"
SOCKET_DIR_ENV = "ANDREA_SOCKET_DIR"
#: sun_path holds 108 bytes; keep a margin for the socket's own name.
_MAX_IPC_PATH = 100

#: Temporaries a checkpoint write leaves behind when it is killed (see checkpoint.durable.tmp_path).
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


def socket_dir(run_dir: Path) -> Path:
    """Directory of the run's control sockets, created owner-only.

    $ANDREA_SOCKET_DIR wins (the units point it at the RuntimeDirectory); otherwise RUN_DIR/.sock,
    or a per-run directory under /tmp when that path is too long for a unix socket.
    """
    if os.environ.get(SOCKET_DIR_ENV):
        d = Path(os.environ[SOCKET_DIR_ENV])
    else:
        d = run_dir.resolve() / SOCKET_DIR
        if len(str(d)) + len("/trainer.sock") > _MAX_IPC_PATH:
            digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
            d = Path(f"/tmp/andrea-{os.getuid()}") / digest
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d


def endpoint(run_dir: Path, role: str) -> str:
    """The ZeroMQ endpoint of the `role` daemon ("trainer" or "proxy") of this run."""
    return f"ipc://{socket_dir(run_dir)}/{role}.sock"
