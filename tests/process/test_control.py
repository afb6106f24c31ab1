"""The trainer's control socket: real ZeroMQ requests to a real trainer process."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import zmq

from andrea.daemon.rundir.layout import endpoint, socket_dir
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.runtime.operator_requests import OperatorRequests, StopReason
from andrea.daemon.trainer.links.control_server import ControlServer
from andrea.protocol import messages
from andrea.protocol.transport import new_id, request
from tests.support import forkserver
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.daemons import andreactl as ctl

#: Seconds to the first steps of a trainer: the first start of a session builds the corpus cache
#: (3.6 s of CPU), which took over 60 s at a load average of 37 on this 2-core machine.
FIRST_STEP = 300


def test_status_checkpoint_wait_and_stop_wait(tmp_path: Path, cache_dir: Path) -> None:
    """One trainer for every check of its socket (a start is most of the cost): owner-only, one
    trainer per run, status, checkpoint --wait, garbage answered, stop --wait."""
    t = Daemon(trainer_cmd(tmp_path, cache_dir, "--max-steps", "100000", "--checkpoint-every", "0"))
    t.wait_for(r"step 2/", timeout=FIRST_STEP)
    _socket_is_owner_only_and_one_trainer_per_run(t, tmp_path, cache_dir)
    t.wait_for(r"step 3/")
    ep = endpoint(tmp_path, "trainer")

    status = request(ep, messages.StatusRequest(id=new_id()), timeout=5)
    assert status.ok and status.data["activity"] == "training" and status.data["step"] >= 3

    reply = request(ep, messages.CheckpointRequest(id=new_id(), wait=True), timeout=30, retries=1)
    assert reply.ok, reply
    name = reply.data["checkpoint"]
    # The reply means durable: payload and manifest are both there when it arrives.
    manifest = json.loads((tmp_path / name.replace(".bin", ".json")).read_text())
    assert (
        manifest["trigger"] == "control"
        and (tmp_path / name).stat().st_size == manifest["bin_size"]
    )

    # Garbage and wrong types are answered with an error and change nothing.
    bad = request_raw(ep, b'{"type": "checkpoint", "id": "x", "boundary": "maybe"}')
    assert bad["ok"] is False and "invalid message" in bad["error"]
    assert (
        request(ep, messages.StatusRequest(id=new_id()), timeout=5).data["activity"] == "training"
    )

    reply = request(ep, messages.StopRequest(id=new_id(), wait=True), timeout=30, retries=1)
    assert reply.ok and reply.data["exit_code"] == 0
    assert t.wait() == ExitCode.OK, t.log
    assert (tmp_path / reply.data["checkpoint"]).exists()


def request_raw(ep: str, payload: bytes) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ep)
    try:
        sock.send_multipart([b"", payload])
        assert sock.poll(5000), "no reply to an invalid message"
        return json.loads(sock.recv_multipart()[-1])
    finally:
        sock.close()


def _socket_is_owner_only_and_one_trainer_per_run(t: Daemon, run: Path, cache_dir: Path) -> None:
    d = socket_dir(run)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    sock_mode = stat.S_IMODE(os.stat(d / "trainer.sock").st_mode)
    assert sock_mode & 0o077 == 0, oct(sock_mode)

    second = forkserver.run(
        trainer_cmd(run, cache_dir, "--max-steps", "5"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == ExitCode.CONFIG_ERROR
    assert f"pid {t.proc.pid}" in second.stderr and "is running on" in second.stderr
    assert t.proc.poll() is None, "a refused second start stopped the first trainer"


class StatusFlood:
    """`n` clients re-sending `status` as soon as each reply arrives (a closed loop, as fast as the
    daemon answers), on real DEALER sockets, driven by one thread of this process."""

    def __init__(self, ep: str, n: int) -> None:
        self.replies = 0
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._socks = []
        for _ in range(n):
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(ep)
            self._socks.append(s)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        poller = zmq.Poller()
        frame = messages.encode(messages.StatusRequest(id="flood"))
        for s in self._socks:
            poller.register(s, zmq.POLLIN)
            s.send_multipart([b"", frame])
        while not self._stop.is_set():
            for s, _ in poller.poll(100):
                s.recv_multipart()
                self.replies += 1
                s.send_multipart([b"", frame])

    def __enter__(self) -> StatusFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for s in self._socks:
            s.close()
        self._ctx.term()


def test_operator_is_answered_during_a_status_flood(tmp_path: Path, cache_dir: Path) -> None:
    """100 pollers flood the sockets of a trainer and its proxy (50 each); `andreactl status` and
    `andreactl stop` from a shell are still answered by both, training goes on, and the stop ends
    with its checkpoint."""
    t = Daemon(
        trainer_cmd(
            tmp_path, cache_dir, "--with-proxy", "--max-steps", "100000", "--checkpoint-every", "0"
        )
    )
    t.wait_for(r"step 3/", timeout=FIRST_STEP)
    with (
        StatusFlood(endpoint(tmp_path, "trainer"), 50) as on_trainer,
        StatusFlood(endpoint(tmp_path, "proxy"), 50) as on_proxy,
    ):
        deadline = time.monotonic() + 30
        # Every poller has been answered, twice on average: the flood is on.
        while on_trainer.replies < 100 or on_proxy.replies < 100:
            assert time.monotonic() < deadline, (on_trainer.replies, on_proxy.replies)
            time.sleep(0.1)
        first = ctl(tmp_path, "status", "--json")
        assert first.returncode == 0, first.stderr
        step = json.loads(first.stdout)["trainer"]["step"]
        t.wait_for(rf"step {step + 2}/")  # trained on through the flood, by its own log
        second = ctl(tmp_path, "status", "--json")
        assert second.returncode == 0, second.stderr
        report = json.loads(second.stdout)
        assert report["state"] == "running" and report["trainer"]["activity"] == "training"
        assert report["proxy"] is not None, "the proxy did not answer"
        assert report["trainer"]["step"] > step, "the flood stopped training"
        stop = ctl(tmp_path, "stop", "--wait", "--timeout", "120")
        assert stop.returncode == 0, stop.stderr
    assert t.wait() == ExitCode.OK, t.log
    assert any(tmp_path.glob("step_*.bin"))


class _FinishAtOnce(OperatorRequests):
    """Flags whose stop request the training loop serves at once: `close` runs (from another
    thread, as the loop would) before `request_stop` returns to the socket thread."""

    def __init__(self) -> None:
        super().__init__()
        self.server: ControlServer | None = None
        self.closing: threading.Thread | None = None

    def request_stop(self, reason: StopReason) -> None:
        super().request_stop(reason)
        assert self.server is not None
        self.closing = threading.Thread(target=self.server.close, args=({"exit_code": 0},))
        self.closing.start()
        time.sleep(0.5)  # close() takes its snapshot of the waiters meanwhile


def test_stop_wait_is_answered_when_the_loop_finishes_at_once(tmp_path: Path) -> None:
    """A `stop --wait` whose stop the loop serves before the request's handler has returned is
    still answered (its waiter is registered before the stop flag is set)."""
    tmp_path.chmod(0o700)
    flags = _FinishAtOnce()
    flags.server = ControlServer(endpoint(tmp_path, "trainer"), flags, lambda: None)
    reply = request(endpoint(tmp_path, "trainer"), messages.StopRequest(id=new_id(), wait=True),
                    timeout=10, retries=1)  # fmt: skip
    assert reply.ok and reply.data == {"exit_code": 0}
    assert flags.closing is not None
    flags.closing.join(timeout=10)
    assert not flags.closing.is_alive()
