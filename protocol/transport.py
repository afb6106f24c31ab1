"""ZeroMQ plumbing shared by the daemons and andreactl: how servers bind, and a client that cannot
wedge. Where the sockets live is the run directory's business (`andrea.daemon.rundir.layout.endpoint`).

- Servers bind ROUTER sockets: a client that dies mid-request cannot block them (a REP socket
  would wait forever for the reply it owes).
- ipc:// socket files are created under umask 077 in an owner-only directory, so no other user
  can connect (chmod after bind would race).
- Clients use the zguide's Lazy Pirate pattern with a DEALER: send, poll with a timeout, and on
  silence close the socket, open a fresh one and resend; replies are matched by request id.
- Every poll has a timeout, so a signal handler's flag is always seen (pyzmq #996).
- A server's last replies (a `stop --wait`'s answer) are sent just before its process exits: its
  router lingers, and the process waits for them to leave (`flush_before_exit`) before exiting.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import zmq

from andrea.protocol.messages import MAX_MESSAGE_BYTES, Message, _Msg, decode, encode

log = logging.getLogger(__name__)


class Unreachable(RuntimeError):
    """No reply from the peer after every retry."""


class PeerGone(Unreachable):
    """The peer a request waits on exited without answering (its `alive` check said so)."""


#: How often a request with an `alive` check looks whether its peer still exists, and how long it
#: then still waits for a reply already on its way.
ALIVE_POLL_S = 0.5

#: How long a closing server still tries to deliver the replies it has queued, and how long its
#: process waits for them before exiting anyway (a client that vanished must not hold it up).
FLUSH_S = 2.0


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
    behind in the run directory (copying a run with shutil.copytree fails on one). Replies already
    sent still leave, for up to FLUSH_S, if the process waits for them (`flush_before_exit`)."""
    sock.close(linger=int(FLUSH_S * 1000))
    if ep.startswith("ipc://"):
        Path(ep[len("ipc://") :]).unlink(missing_ok=True)


def flush_before_exit(timeout: float = FLUSH_S) -> None:
    """Wait, at most `timeout` seconds, until the replies queued on closed sockets have left (a
    warning if they did not).

    ZeroMQ sends from its own I/O thread: a reply handed to a socket just before the process exits
    (os._exit, or an interpreter that never terminates the context) was lost under load, and a
    `stop --wait` then reported the trainer gone without answering. Terminating the context waits
    for every closed socket's linger; it runs on a thread of its own because a socket still open
    elsewhere would make it wait forever."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    done = threading.Thread(target=ctx.term, name="zmq-flush", daemon=True)
    done.start()
    done.join(timeout)
    if done.is_alive():
        log.warning(
            "replies still queued after %.0f s are dropped (their clients are gone?)", timeout
        )


def new_id() -> str:
    return uuid.uuid4().hex[:16]


def request(
    ep: str,
    msg: _Msg,
    timeout: float = 2.0,
    retries: int = 3,
    alive: Callable[[], bool] | None = None,
) -> Message:
    """Send one request and return its reply (Lazy Pirate). Raises Unreachable; PeerGone when
    `alive` (looked at every `ALIVE_POLL_S` while waiting) says the peer exited and no reply came
    within `ALIVE_POLL_S` after: a long wait (a checkpoint, a stop) ends when its peer does."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    payload = encode(msg)
    for _ in range(retries):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.connect(ep)
        try:
            sock.send_multipart([b"", payload])
            deadline = time.monotonic() + timeout
            gone = False
            while (left := deadline - time.monotonic()) > 0:
                slice_s = left if alive is None else min(left, ALIVE_POLL_S)
                if not sock.poll(int(slice_s * 1000)):
                    if gone:
                        raise PeerGone(f"{ep}: the process it waited on exited without answering")
                    gone = alive is not None and not alive()
                    if alive is None:
                        break
                    continue
                frames = sock.recv_multipart()
                reply = decode(frames[-1])
                if reply.id == msg.id:
                    return reply
        finally:
            sock.close()
    raise Unreachable(f"no reply from {ep} after {retries} tries of {timeout:.1f} s")
