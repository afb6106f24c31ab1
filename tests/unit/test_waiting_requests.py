"""``andreactl checkpoint --wait`` and ``stop --wait`` against a trainer that goes away without answering
(killed, or ended during its start): the client learns it from the run's lock, at once, and exits 4
with a message, instead of waiting out its --timeout. A refusal that gives no reason says the exit
code instead of "error: None". The "trainer" here is this process: its lock and a socket that never
answers (no process is started)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import zmq

from andrea.control import andreactl
from andrea.control.commands.conventions import EXIT_GONE
from andrea.control.commands.trainer_requests import _refusal
from andrea.daemon.rundir.layout import CONFIG_FILE, bind_endpoint, claim
from andrea.protocol.transport import bind_router, close_router


@pytest.mark.parametrize("command", ["checkpoint", "stop"])
def test_a_wait_ends_when_the_trainer_exits_without_answering(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / CONFIG_FILE).write_text("")
    lock = claim(tmp_path, "trainer")
    ep = bind_endpoint(tmp_path, "trainer")
    sock = bind_router(zmq.Context.instance(), ep)  # reads nothing, answers nothing
    # The trainer "dies" after a second: the kernel releases its lock (here: closing it).
    threading.Timer(1.0, lock.close).start()
    t0 = time.monotonic()
    try:
        code = andreactl.main(["--run-dir", str(tmp_path), command, "--wait", "--timeout", "60"])
    finally:
        close_router(sock, ep)
    waited = time.monotonic() - t0
    assert code == EXIT_GONE, capsys.readouterr()
    assert waited < 5, f"{waited:.1f} s: the client waited out more than the trainer's life"
    err = capsys.readouterr().err
    assert "exited without answering" in err and f"no {command} to confirm" in err, err


def test_a_refusal_without_a_reason_says_the_exit_code() -> None:
    assert _refusal(None, {"exit_code": 3, "step": 5}) == (
        "the trainer exited with code 3; its log says why"
    )
    assert _refusal("final checkpoint of step 5 FAILED (No space left)", {}) == (
        "final checkpoint of step 5 FAILED (No space left)"
    )


def test_a_stop_awaited_during_the_start_is_answered_when_the_start_ends(tmp_path: Path) -> None:
    """The trainer's side: a start that ends before training (here: stopped while it prepares its
    data) answers `stop --wait` with its exit code and why, and `checkpoint --wait` that none comes."""
    from concurrent.futures import ThreadPoolExecutor

    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.daemon.trainer.links.control_server import ControlServer
    from andrea.protocol import messages
    from andrea.protocol.transport import new_id, request

    flags = OperatorRequests()
    ep = bind_endpoint(tmp_path, "trainer")
    server = ControlServer(ep, flags, status=lambda: None)  # type: ignore[arg-type,return-value]
    with ThreadPoolExecutor(2) as pool:
        checkpoint = pool.submit(
            request, ep, messages.CheckpointRequest(id=new_id(), wait=True), 30, 1
        )
        while flags.checkpoint_reason is None:
            time.sleep(0.01)
        stop = pool.submit(request, ep, messages.StopRequest(id=new_id(), wait=True), 30, 1)
        while not flags.stop_requested():
            time.sleep(0.01)
        server.abandon(0, "stopped during start-up; nothing was trained")
        stopped, checkpointed = stop.result(10), checkpoint.result(10)
    assert stopped.ok and stopped.data["ended"] == "stopped during start-up; nothing was trained"
    assert stopped.data["exit_code"] == 0 and stopped.data["checkpoint"] is None
    assert not checkpointed.ok
    assert checkpointed.error == "no checkpoint: stopped during start-up; nothing was trained"


def test_a_final_checkpoint_that_failed_is_answered_with_its_reason(tmp_path: Path) -> None:
    """`stop --wait` on a full disk printed "error: None": the reply now carries the reason the
    checkpointer logged."""
    from concurrent.futures import ThreadPoolExecutor

    from andrea.daemon.runtime.operator_requests import OperatorRequests
    from andrea.daemon.trainer.links.control_server import ControlServer
    from andrea.protocol import messages
    from andrea.protocol.transport import new_id, request

    flags = OperatorRequests()
    ep = bind_endpoint(tmp_path, "trainer")
    server = ControlServer(ep, flags, status=lambda: None)  # type: ignore[arg-type,return-value]
    why = "final checkpoint of step 7 FAILED ([Errno 28] No space left on device); ..."
    with ThreadPoolExecutor(1) as pool:
        stop = pool.submit(request, ep, messages.StopRequest(id=new_id(), wait=True), 30, 1)
        while not flags.stop_requested():
            time.sleep(0.01)
        server.close({"step": 7, "exit_code": 3, "checkpoint": "step_000005.bin"}, error=why)
        reply = stop.result(10)
    assert not reply.ok and reply.error == why
