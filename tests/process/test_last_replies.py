"""A server's last replies reach their client although its process exits right after sending them.

The trainer answers `andreactl stop --wait` after its final checkpoint and then exits with
os._exit. ZeroMQ writes from its own I/O thread, so a reply handed to the socket just before the
exit was lost under load (CI, 2026-12-07: `stop --wait` exited 4, "the trainer exited without
answering", about one stop in eight on a loaded 2-core machine). Here a real server process sends
16 MiB of replies (far more than a socket buffer holds, so none can have left by the time it
exits) and exits the same way; the negative control skips the wait for them and must lose some.
Its client reads nothing until the server has exited, and holds at most one reply in its queue: a
client that reads as fast as the server's I/O thread writes can drain all 16 MiB before the exit on
an idle machine (CI, 2026-12-07: all 256 arrived), and so could its own I/O thread with ZeroMQ's
default queue while the test did not read (CI, 2026-12-08); the control would then prove nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import zmq

from andrea.protocol.transport import FLUSH_S

REPLIES = 256
SIZE = 64 << 10

SERVER = f"""
import os, sys, zmq
from andrea.protocol.transport import bind_router, close_router, flush_before_exit
ep, wait = sys.argv[1], sys.argv[2] == "wait"
sock = bind_router(zmq.Context.instance(), ep)
print("bound", flush=True)
peer = sock.recv_multipart()[0]
for _ in range({REPLIES}):
    sock.send_multipart([peer, b"", bytes({SIZE})])
close_router(sock, ep)
if wait:
    flush_before_exit()
os._exit(0)
"""


def _replies_received(tmp_path: Path, wait: bool, read_after_exit: bool = False) -> int:
    ep = f"ipc://{tmp_path}/server-{wait}.sock"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, ep, "wait" if wait else "exit"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline() == "bound\n"
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if read_after_exit:
        # Not reading is not enough: the client's own I/O thread drains the socket into its queue
        # (up to the high-water mark, 1,000 messages) while the test waits, and on a fast machine
        # took all 256 before the server exited. With a queue of one and a small kernel buffer the
        # server's writes stall until it exits, as a busy client's would.
        sock.setsockopt(zmq.RCVHWM, 1)
        sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(ep)
    got = 0
    try:
        sock.send_multipart([b"", b"last words?"])
        if read_after_exit:
            server.wait(timeout=FLUSH_S + 30)
        # Whatever the server wrote before it exited is in the kernel's buffers then: once it has
        # exited, a short silence means nothing more is coming.
        while sock.poll(200) or server.poll() is None:
            if sock.poll(0):
                sock.recv_multipart()
                got += 1
    finally:
        sock.close()
    assert server.wait(timeout=FLUSH_S + 30) == 0
    return got


def test_a_server_that_exits_after_replying_delivers_every_reply(tmp_path: Path) -> None:
    assert _replies_received(tmp_path, wait=True) == REPLIES


def test_negative_control_exiting_without_waiting_loses_replies(tmp_path: Path) -> None:
    assert _replies_received(tmp_path, wait=False, read_after_exit=True) < REPLIES
