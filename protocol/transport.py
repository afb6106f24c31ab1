"""ZeroMQ plumbing shared by the daemons and andreactl: where sockets live, how servers bind, and a
client that cannot wedge.

- Servers bind ROUTER sockets: a client that dies mid-request cannot block them (a REP socket
  would wait forever for the reply it owes).
- ipc:// socket files are created under umask 077 in an owner-only directory, so no other user
  can connect (chmod after bind would race).
- Clients use the zguide's Lazy Pirate pattern with a DEALER: send, poll with a timeout, and on
  silence close the socket, open a fresh one and resend; replies are matched by request id.
- Every poll has a timeout, so a signal handler's flag is always seen (pyzmq #996).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
import uuid
from pathlib import Path
from typing import IO

import zmq

from .messages import MAX_MESSAGE_BYTES, Message, _Msg, decode, encode

#: sun_path holds 108 bytes; keep a margin for the socket's own name.
_MAX_IPC_PATH = 100


class Unreachable(RuntimeError):
    """No reply from the peer after every retry."""


class AlreadyRunning(RuntimeError):
    """Another process of the same role holds this run directory."""


def socket_dir(run_dir: Path) -> Path:
    """Directory of the run's control sockets, created owner-only.

    $ANDREA_SOCKET_DIR wins (the units point it at the RuntimeDirectory); otherwise RUN_DIR/.sock,
    or a per-run directory under /tmp when that path is too long for a unix socket.
    """
    if os.environ.get("ANDREA_SOCKET_DIR"):
        d = Path(os.environ["ANDREA_SOCKET_DIR"])
    else:
        d = run_dir.resolve() / ".sock"
        if len(str(d)) + len("/trainer.sock") > _MAX_IPC_PATH:
            digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
            d = Path(f"/tmp/andrea-{os.getuid()}") / digest
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    return d


def endpoint(run_dir: Path, role: str) -> str:
    return f"ipc://{socket_dir(run_dir)}/{role}.sock"


def claim(run_dir: Path, role: str) -> IO[bytes]:
    """Hold `RUN_DIR/.ROLE.lock` for the life of the process: two trainers (or two proxies) on one
    run directory would interleave checkpoints and steal each other's socket."""
    f = open(run_dir / f".{role}.lock", "a+b")
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


def bind_router(ctx: zmq.Context, ep: str) -> zmq.Socket:
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    sock.setsockopt(zmq.LINGER, 0)
    old = os.umask(0o077)
    try:
        sock.bind(ep)
    finally:
        os.umask(old)
    return sock


def close_router(sock: zmq.Socket, ep: str) -> None:
    """Close a server socket and remove its ipc file, so that a stopped daemon leaves no socket
    behind in the run directory (copying a run with shutil.copytree fails on one)."""
    sock.close(linger=0)
    if ep.startswith("ipc://"):
        Path(ep[len("ipc://") :]).unlink(missing_ok=True)


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def request(ep: str, msg: _Msg, timeout: float = 2.0, retries: int = 3) -> Message:
    """Send one request and return its reply (Lazy Pirate). Raises Unreachable."""
    ctx = zmq.Context.instance()
    payload = encode(msg)
    for _ in range(retries):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.connect(ep)
        try:
            sock.send_multipart([b"", payload])
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(left * 1000)):
                    break
                frames = sock.recv_multipart()
                reply = decode(frames[-1])
                if reply.id == msg.id:
                    return reply
        finally:
            sock.close()
    raise Unreachable(f"no reply from {ep} after {retries} tries of {timeout:.1f} s")
