"""A second, well-formed peer on the proxy socket while the trainer lives (issue 24, item 3), with
real daemons: the trainer is paused (SIGSTOP) and a hostile process speaks the link's protocol —
a new `hello`, a `hello` impersonating the live segment, a `hello{resume_step: 0}`, an `assign`
and `losses` of 0.01. None of it is taken: the final weights equal those of a run without the
peer, no injected loss is in the log, and pivots still see the trainer's progress."""

from __future__ import annotations

import secrets
import signal
import sys
from pathlib import Path

import zmq

from andrea.daemon.config import build_config, load_toml
from andrea.daemon.rundir.layout import CONFIG_FILE, LOSS_FILE, bin_name, lock_holder, peer_endpoint
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.protocol import messages
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.transport import new_id, request
from tests.support.daemons import Daemon, trainer_cmd

STEPS = 30
#: Seconds to wait for a daemon's exit: generous, for a loaded 2-core machine.
WAIT = 300


class Peer:
    """One DEALER socket on the proxy's endpoint, as a trainer holds it."""

    def __init__(self, ep: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(ep)

    def ask(self, msg: messages._Msg) -> messages.Message:
        self.sock.send_multipart([b"", messages.encode(msg)])
        assert self.sock.poll(30_000), f"no reply to {msg.type}"
        return messages.decode(self.sock.recv_multipart()[-1])

    def close(self) -> None:
        self.sock.close(linger=0)


def _daemons(run: Path, cache: Path) -> tuple[Daemon, Daemon]:
    p = Daemon([sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run)])
    t = Daemon(
        trainer_cmd(run, cache, "--mixing", "proxy", "--max-steps", str(STEPS))
        + ["--checkpoint-every", "0", "--eval-every", "0"]
    )
    return p, t


def _finish(p: Daemon, t: Daemon) -> None:
    assert t.wait(WAIT) == ExitCode.OK, t.log
    p.signal(signal.SIGTERM)
    assert p.wait(WAIT) == ExitCode.OK, p.log


def _proxy_status(run: Path) -> dict:
    reply = request(peer_endpoint(run, "proxy"), messages.StatusRequest(id=new_id()), timeout=10)
    return reply.data


def _attack(run: Path) -> list[messages.Message]:
    """The hostile sequence; every reply it got."""
    cfg = build_config(load_toml(run / CONFIG_FILE))
    arms = [a.name for a in cfg.data.arms]
    logged = _proxy_status(run)["durable_step"]
    peer = Peer(peer_endpoint(run, "proxy"))
    replies: list[messages.Message] = []
    try:
        # The strongest forgery: the live trainer's own pid (the trainer lock names it).
        forged = {"pid": lock_holder(run, "trainer"), "life": secrets.token_hex(16)}
        for hello in (
            messages.Hello(id=new_id(), resume_step=logged, seed=cfg.seed, arms=arms, **forged),
            messages.Hello(
                id=new_id(), segment=1, resume_step=logged, seed=cfg.seed, arms=arms, **forged
            ),
            messages.Hello(id=new_id(), resume_step=0, seed=cfg.seed, arms=arms),
        ):
            replies.append(peer.ask(hello))
        segment = next((r.segment for r in replies if isinstance(r, messages.Welcome)), 1)
        got = peer.ask(
            messages.AssignRequest(id=new_id(), segment=segment, from_step=logged + 1, count=8)
        )
        assert isinstance(got, messages.Assignments) and got.items, got
        for seg in {segment, 1}:
            entries = [
                LossEntry(
                    step=a.step,
                    loss=0.01,
                    arm=a.arm,
                    lr=1e-3,
                    tokens=4096,
                    wall_time=1.0,
                    segment=seg,
                    phase=a.phase,
                    batch_sha256=None,
                )
                for a in got.items
            ]
            replies.append(peer.ask(messages.LossReport(id=new_id(), entries=entries)))
    finally:
        peer.close()
    return replies


def test_a_second_peer_cannot_displace_the_trainer_or_inject_losses(
    tmp_path: Path, cache_dir: Path
) -> None:
    reference = tmp_path / "reference"
    _finish(*_daemons(reference, cache_dir))

    run = tmp_path / "attacked"
    p, t = _daemons(run, cache_dir)
    t.wait_for(r"step 8/", timeout=300)
    t.signal(signal.SIGSTOP)
    try:
        before = _proxy_status(run)
        replies = _attack(run)
        after = _proxy_status(run)
    finally:
        t.signal(signal.SIGCONT)
    _finish(p, t)

    assert (run / bin_name(STEPS)).read_bytes() == (reference / bin_name(STEPS)).read_bytes()
    entries = read_entries(run / LOSS_FILE)
    assert {e.segment for e in entries} == {1} and all(e.loss != 0.01 for e in entries)
    assert [e.step for e in canonical_curve(entries)] == list(range(1, STEPS + 1))
    # Refused, every message, naming the live trainer; the trainer's progress stays its own.
    refusals = [r for r in replies if isinstance(r, messages.Reply) and not r.ok]
    assert len(refusals) == len(replies), replies
    assert all(r.error.startswith(messages.TRAINER_ALIVE) for r in refusals[:3]), refusals
    assert all(r.error.startswith(messages.UNKNOWN_PEER) for r in refusals[3:]), refusals
    assert after["max_segment"] == 1 and after["trainer_step"] >= before["trainer_step"] > 0
