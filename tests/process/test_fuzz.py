"""The fuzz harness's process cases (tests/unit/test_fuzz.py says what is fuzzed and the oracle):
every message type into a real proxy and into the trainer's control server over real ipc sockets,
and every command's reads of links and FIFOs, each guarded by an alarm signal against blocking.
Run long with ANDREA_FUZZ_EXAMPLES=2000."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from hypothesis import assume, given
from hypothesis import strategies as st
from pydantic import ValidationError

from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.proxy import Proxy, ProxyOptions
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.trainer.links.control_server import ControlServer
from andrea.daemon.trainer.links.hold_registry import HoldRegistry
from andrea.protocol import messages
from andrea.protocol.status import Activity, TrainerStatus
from tests.support.fuzzing import (
    FUZZ,
    READERS,
    Blocked,
    atime_is_recorded,
    bounded,
    build_proxy_run,
    build_stopped_run,
    mutate_bytes,
    mutations,
    plant,
    snapshot,
    within_alarm,
)
from tests.support.hostile import TRAINER_LIFE, play_trainer, text_arms_config, trainer_hello

# ---- the proxy's own files: .state.json and .samples.json ---------------------------------------


@pytest.fixture(scope="module")
def proxy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A proxy run directory with a valid .state.json and .samples.json."""
    return build_proxy_run(tmp_path_factory.mktemp("fuzz-proxy"))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory, proxy_run: Path) -> Path:
    """A stopped run with one of every file a command reads (tests/support/fuzzing.py)."""
    return build_stopped_run(tmp_path_factory.mktemp("fuzz-links") / "run", proxy_run)


@pytest.fixture(scope="module")
def atime_is_kept(tmp_path_factory: pytest.TempPathFactory) -> bool:
    """Whether this filesystem records a read in the access time; the link oracle relies on it."""
    return atime_is_recorded(tmp_path_factory.mktemp("atime"))


# ---- every message type, into a real proxy --------------------------------------------------------

VALID_MESSAGES: dict[str, dict] = {
    "hello": {
        "type": "hello",
        "id": "h",
        "resume_step": 0,
        "seed": 1337,
        "arms": ["alpha", "beta"],
        "pid": os.getpid(),
        "life": TRAINER_LIFE,
    },
    "assign": {"type": "assign", "id": "a", "segment": 1, "from_step": 1, "count": 2},
    "losses": {
        "type": "losses",
        "id": "l",
        "entries": [
            {
                "step": 1,
                "loss": 2.0,
                "arm": "alpha",
                "lr": 0.001,
                "tokens": 64,
                "wall_time": 1.0,
                "segment": 1,
                "phase": 0,
                "batch_sha256": None,
            }
        ],
    },
    "samples": {
        "type": "samples",
        "id": "s",
        "step": 1,
        "segment": 1,
        "phase": 0,
        "samples": [{"prompt": "a", "text": "b"}],
    },
    "status": {"type": "status", "id": "st"},
    "checkpoint": {
        "type": "checkpoint",
        "id": "c",
        "boundary": False,
        "wait": False,
    },
    "hold": {"type": "hold", "id": "hh", "timeout_s": 600.0},
    "resume": {"type": "resume", "id": "r", "hold_id": "h"},
    "stop": {"type": "stop", "id": "x", "wait": False},
    "pivot": {"type": "pivot", "id": "p", "policy_toml": "lag = 4\n", "boundary_step": 1},
}


@pytest.fixture
def live_proxy(tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(ProxyOptions(tmp_path, text_arms_config(tmp_path), Policy(lag=2)), OperatorRequests())
    p.setup()
    # The fuzzer is the live trainer: its records pass the peer check and meet the entry checks.
    with play_trainer(tmp_path):
        p.handle(b"fuzzer", trainer_hello(p.opts.cfg, "h0"))
    yield p
    p.close()


@pytest.mark.parametrize("kind", VALID_MESSAGES)
@FUZZ
@given(data=st.data())
def test_fuzz_message(live_proxy: Proxy, kind: str, data: st.DataObject) -> None:
    messages.decode(json.dumps(VALID_MESSAGES[kind]).encode())  # the starting point is valid
    _, bad = data.draw(mutations(VALID_MESSAGES[kind]))
    try:
        frame = json.dumps(bad).encode()
    except ValueError:
        assume(False)
    try:
        msg = messages.decode(frame)
    except (ValidationError, ValueError):  # answered "invalid message", nothing handled
        return
    before = snapshot(live_proxy.run_dir)
    reply = bounded(lambda: live_proxy.handle(b"fuzzer", msg))
    assert reply is not None
    messages.decode(messages.encode(reply))  # a well-formed reply
    if isinstance(reply, messages.Reply) and not reply.ok:
        after = snapshot(live_proxy.run_dir)
        assert after == before, f"a rejected {kind} changed the run directory"


# ---- every message type, into the trainer's control server ---------------------------------------


def _trainer_status() -> TrainerStatus:
    return TrainerStatus(
        pid=os.getpid(),
        activity=Activity.TRAINING,
        step=7,
        max_steps=100,
        loss_ema=3.5,
        last_checkpoint=5,
        segment=1,
        phase=0,
        mixing="fixed",
        proxy_connected=None,
        preset="andrea-tiny",
        run_dir="/nonexistent",
        device="cpu",
        dtype="float32",
    )


class LiveControl:
    """A real ControlServer thread on a real ipc socket, with a DEALER client; fresh flags and
    holds for every case, so that each case's effect is its own."""

    def __init__(self, run_dir: Path) -> None:
        self.server = ControlServer(
            rundir.endpoint(run_dir, "trainer"), OperatorRequests(), _trainer_status
        )
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(rundir.endpoint(run_dir, "trainer"))

    def reset(self) -> None:
        self.server.flags, self.server.holds = OperatorRequests(), HoldRegistry()
        self.server.holds.on_settled(self.server._hold_settled)

    def state(self) -> tuple:
        f, hold = self.server.flags, self.server.holds.describe()
        return (
            f.stop_reason,
            f.checkpoint_reason,
            f.boundary_requested,
            f.hold_requested,
            f.resume_requested,
            hold.model_dump(exclude={"age_s"}) if hold else None,
        )

    def ask(self, frame: bytes, timeout_ms: int) -> messages.Reply | None:
        self.sock.send_multipart([b"", frame])
        if not self.sock.poll(timeout_ms):
            return None
        reply = messages.decode(self.sock.recv_multipart()[-1])
        assert isinstance(reply, messages.Reply), reply
        return reply

    def close(self) -> None:
        self.sock.close()
        self.server.close({"exit_code": 0})


@pytest.fixture
def live_control(tmp_path: Path) -> Iterator[LiveControl]:
    c = LiveControl(tmp_path)
    yield c
    # The thread survived every case: a plain status is still answered.
    c.reset()
    reply = c.ask(messages.encode(messages.StatusRequest(id="alive")), 5000)
    assert reply is not None and reply.ok and reply.data["step"] == 7
    c.close()


def _trainer_frame(kind: str, data: st.DataObject) -> bytes:
    if kind == "bytes":  # raw frames: a valid message cut, grown, bit-flipped or nested deep

        def deep(buf: bytearray, at: int) -> None:
            buf[at:at] = b"[" * data.draw(st.sampled_from([1000, 100_000]))

        kind = data.draw(st.sampled_from(list(VALID_MESSAGES)))
        return mutate_bytes(json.dumps(VALID_MESSAGES[kind]).encode(), data, deep)
    _, bad = data.draw(mutations(VALID_MESSAGES[kind]))
    try:
        return json.dumps(bad).encode()
    except ValueError:
        assume(False)
        raise


@pytest.mark.parametrize("kind", [*VALID_MESSAGES, "bytes"])
@FUZZ
@given(data=st.data())
def test_fuzz_trainer_control(live_control: LiveControl, kind: str, data: st.DataObject) -> None:
    """The trainer answers every frame with a well-formed reply (or, for a valid `wait` request,
    with the reply once served); a rejected one changes no flag and no hold."""
    c = live_control
    c.reset()
    frame = _trainer_frame(kind, data)
    try:
        msg: messages.Message | None = messages.decode(frame)
    except (ValidationError, ValueError):
        msg = None
    before = c.state()
    reply = bounded(lambda: c.ask(frame, 5000))
    if reply is None:  # only a request that waits for its work is answered later
        if isinstance(msg, messages.HoldRequest):  # answered once the trainer holds
            assert c.state() != before
            return
        assert isinstance(msg, messages.CheckpointRequest | messages.StopRequest) and msg.wait, (
            frame[:200]
        )
        assert c.state() != before
        if isinstance(msg, messages.CheckpointRequest):
            # Served: its reply comes now. A status sent at once may overtake it (the thread
            # may be waiting on the socket when the reply is queued), so both are collected.
            c.server.checkpoint_served({"step": 7})
            first = c.ask(messages.encode(messages.StatusRequest(id="status-after-serving")), 5000)
            assert first is not None and c.sock.poll(5000)
            second = messages.decode(c.sock.recv_multipart()[-1])
            served = {r.id: r for r in (first, second)}
            assert set(served) == {msg.id, "status-after-serving"} and served[msg.id].ok
        return
    if msg is None:
        assert not reply.ok and reply.error.startswith("invalid message"), reply
    else:
        assert reply.id == msg.id
    if not reply.ok:
        assert c.state() == before, f"a rejected frame changed the trainer's flags: {frame[:200]!r}"


# ---- links and FIFOs: every run-directory file any command reads -------------------------------
#
# Two more kinds for each file: a link to a valid copy of it outside the run directory (so that a
# reader that followed it would succeed, and show it), and a FIFO (so that a reader that opened it
# as a file would block forever). The oracle: every command returns a documented exit code without
# a traceback, within ALARM_S; the run directory is left exactly as it was; and the link's target
# is never read (its access time stays where the test set it: the epoch).


def _argv(command: str, run: Path, out: Path) -> list[str]:
    return {
        "status": ["status"],
        "stop": ["stop"],
        "history": ["history"],
        "history --eval": ["history", "--eval"],
        "samples": ["samples"],
        "plot": ["plot", "--out", str(out / "plot.svg")],
        "metrics": ["metrics", "export", "--format", "csv", "--out", str(out / "m.csv")],
        "checkpoints": ["checkpoints"],
        "prune": ["prune", "--dry-run"],
        "export": ["export", "--to", str(out / "export")],
        "verify-resume": ["verify-resume", "--problem", "trainer", "--output", str(out / "v")],
    }[command] + ["--run-dir", str(run)]


def _tree(run: Path) -> dict[str, object]:
    """What lies in the run directory, never through a link and never opening a FIFO."""
    out: dict[str, object] = {}
    for here, dirs, files in os.walk(run):
        for name in dirs + files:
            p = Path(here, name)
            key = str(p.relative_to(run))
            if p.is_symlink():
                out[key] = ("link", os.readlink(p))
            elif p.is_fifo():
                out[key] = "fifo"
            elif p.is_file():
                out[key] = p.read_bytes()
    return out


# an alarm signal guards each command against blocking; ~1 s a case
@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize("name", READERS)
def test_commands_never_follow_a_link_or_block_on_a_fifo(
    stopped_run: Path, tmp_path: Path, name: str, kind: str, atime_is_kept: bool, capsys
) -> None:
    from andrea.control import andreactl

    run = tmp_path / "run"
    shutil.copytree(stopped_run, run)
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = plant(run, name, kind, outside)
    before = _tree(run)
    holder = None
    if name == rundir.SOCKET_DIR_RECORD:  # as if a trainer ran: status then looks for its socket
        holder = os.open(rundir.lock_path(run, "trainer"), os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        for command in READERS[name]:
            out = tmp_path / f"out-{command.replace(' ', '-')}"
            out.mkdir()
            try:
                code = within_alarm(andreactl.main, _argv(command, run, out))
            except Blocked:
                pytest.fail(f"`andreactl {command}` blocked on {name} ({kind})")
            said = capsys.readouterr()
            assert code in (0, 1, 2, 3), (command, code, said.err)
            assert "Traceback" not in said.err, (command, said.err)
            if atime_is_kept:
                unread = [t for t in targets if t.stat().st_atime == 0]
                assert unread == targets, f"`andreactl {command}` read {name} through its link"
    finally:
        if holder is not None:
            os.close(holder)
    assert _tree(run) == before, f"a command changed the run directory ({name}, {kind})"


#: What the daemons read at start, and the outcome each documents for a link or a FIFO there.


# ---- links among an arm's files -----------------------------------------------------------------
#
# A run's text and JSON Lines arms with links planted among their files: to a 0600 file outside
# (directly, through a directory link, a relative `../..`, or a chain of links), inside the arm or
# the run (directly, or through a hop outside that comes back), dangling, to a FIFO or /dev/zero.
# The oracle: a link whose target lies outside the arm's directory and the run's refuses the arm
# (SourceRejected) unless the arm says links = "follow", and then nothing of the secret is read (its
# access time stays at the epoch) nor reaches the cache; any other planting is read or passed over;
# nothing blocks, and nothing else escapes.

#: Each planting: (where the link goes, whether it leaves the arm's directory and the run's).


# ---- what an arm reads: JSON Lines lines, and the token cache -----------------------------------

#: The line bound of the JSON Lines cases (small, so that a case crosses it cheaply).
