"""The proxy's trust boundary (issue 12, item 2): every field of a `hello` or `losses` message is
checked against the proxy's own state before anything is written, and a rejected message changes
nothing — not .loss.json, not the bandit, not what a restarted proxy does."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import ValidationError

from andrea.daemon.mixing import rewards
from andrea.daemon.mixing.policy import NEW_RUN_REWARD, REWARDS, ArmBounds, Policy
from andrea.daemon.mixing.proxy import LogContradiction, Proxy, ProxyOptions
from andrea.daemon.rundir.layout import (
    EVAL_FILE,
    LOSS_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    peer_endpoint,
)
from andrea.daemon.rundir.losslog import read_entries
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.trainer.counters import Counters
from andrea.daemon.trainer.links.proxy_client import ProxyLink
from andrea.daemon.trainer.sink import ProxySink
from andrea.protocol import messages
from andrea.protocol.evalentry import ArmEval, EvalEntry
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.transport import request
from tests.support.hostile import play_trainer, text_arms_config, trainer_hello, write_checkpoint

PEER = b"trainer"
T = TypeVar("T")


def _proxy(run_dir: Path, reward: str = NEW_RUN_REWARD) -> Proxy:
    # A reward that serves a target needs one (the policy refuses it without): the first arm.
    target = {"alpha": 1.0} if rewards.lookup(reward).targeted else {}
    policy = Policy(lag=2, reward=reward, target=target)
    p = Proxy(ProxyOptions(run_dir, text_arms_config(run_dir), policy), OperatorRequests())
    p.setup()
    return p


def _again(proxy: Proxy) -> Proxy:
    """The proxy restarted on the same run, under the same reward."""
    return _proxy(proxy.run_dir, proxy.opts.policy.reward)


def _entry(step: int, arm: str, segment: int = 1, **kw) -> LossEntry:
    fields = dict(
        step=step,
        loss=3.0,
        arm=arm,
        lr=1e-3,
        tokens=64,
        wall_time=time.time(),
        segment=segment,
        phase=0,
        batch_sha256=None,
    )
    return LossEntry(**{**fields, **kw})


@pytest.fixture(params=REWARDS)
def proxy(tmp_path: Path, request: pytest.FixtureRequest):
    p = _proxy(tmp_path, request.param)
    lock = play_trainer(tmp_path)
    welcome = p.handle(PEER, trainer_hello(p.opts.cfg))
    assert isinstance(welcome, messages.Welcome) and welcome.segment == 1
    got = p.handle(PEER, messages.AssignRequest(id="a", segment=1, from_step=1, count=2))
    p.arms = {a.step: a.arm for a in got.items}
    yield p
    p.close()
    lock.close()


def _durable(run_dir: Path) -> tuple[bytes, bytes]:
    return (run_dir / LOSS_FILE).read_bytes(), (run_dir / STATE_FILE).read_bytes()


def _other(arm: str) -> str:
    return "beta" if arm == "alpha" else "alpha"


@pytest.mark.parametrize(
    "name,bad",
    [
        ("unknown-arm", lambda arms: _entry(1, "gamma")),
        ("wrong-arm", lambda arms: _entry(1, _other(arms[1]))),
        ("never-assigned-step", lambda arms: _entry(500, "alpha")),
        ("unnumbered-segment", lambda arms: _entry(1, arms[1], segment=7)),
        ("future-phase", lambda arms: _entry(1, arms[1], phase=3)),
    ],
)
def test_rejected_loss_report_changes_nothing(proxy: Proxy, name: str, bad) -> None:
    run_dir = proxy.run_dir
    before = _durable(run_dir)
    reply = proxy.handle(
        PEER, messages.LossReport(id="x", entries=[_entry(2, proxy.arms[2]), bad(proxy.arms)])
    )
    assert isinstance(reply, messages.Reply) and not reply.ok and "losses rejected" in reply.error
    assert _durable(run_dir) == before
    # The trainer's genuine record for the same step is still taken: nothing was lost.
    ack = proxy.handle(PEER, messages.LossReport(id="y", entries=[_entry(1, proxy.arms[1])]))
    assert isinstance(ack, messages.LossAck) and ack.keys == [(1, 1)]
    assert [(e.step, e.arm) for e in read_entries(run_dir / LOSS_FILE)] == [(1, proxy.arms[1])]


def test_held_out_losses_of_an_arm_the_proxy_does_not_configure_are_taken(proxy: Proxy) -> None:
    """A trainer still evaluates an arm the proxy's config dropped (it is a zombie there): its
    record is genuine, and the bandit ignores the arm it does not know."""
    entry = _entry(1, proxy.arms[1], heldout={"gamma": 2.0, proxy.arms[1]: 2.5})
    ack = proxy.handle(PEER, messages.LossReport(id="y", entries=[entry]))
    assert isinstance(ack, messages.LossAck) and ack.keys == [(1, 1)]
    assert read_entries(proxy.run_dir / LOSS_FILE)[0].heldout == entry.heldout


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type":"losses","id":"x","entries":[{"step":1,"loss":1.0,"arm":"'
        + b"a" * 65536
        + b'","lr":0.001,"tokens":64,"wall_time":1.0,"segment":1,"phase":0,"batch_sha256":null}]}',
        b'{"type":"losses","id":"x","entries":[{"step":1000000000000000000000000000000,"loss":1.0,'
        b'"arm":"alpha","lr":0.001,"tokens":64,"wall_time":1.0,"segment":1,"phase":0,"batch_sha256":null}]}',
        b'{"type":"losses","id":"x","entries":[{"step":1,"loss":1.0,"arm":"alpha","lr":0.001,'
        b'"tokens":64,"wall_time":1.0,"segment":1000000000000000000000000000000,"phase":0,"batch_sha256":null}]}',
        b'{"type":"hello","id":"h","segment":1000000000000000000000000000000,"resume_step":0,"seed":1,"arms":[]}',
        b'{"type":"hello","id":"h","resume_step":1000000000000000000000000000000,"seed":1,"arms":[]}',
    ],
    ids=["arm-64k", "step-1e30", "segment-1e30", "hello-segment-1e30", "hello-resume-1e30"],
)
def test_out_of_range_fields_are_refused_at_decoding(frame: bytes) -> None:
    with pytest.raises(ValidationError):
        messages.decode(frame)


def test_hello_with_an_unnumbered_segment_is_refused(proxy: Proxy) -> None:
    before = _durable(proxy.run_dir)
    reply = proxy.handle(PEER, trainer_hello(proxy.opts.cfg, "h2", segment=40))
    assert isinstance(reply, messages.Reply) and not reply.ok and "never numbered" in reply.error
    assert _durable(proxy.run_dir) == before


def test_restart_after_an_attack_is_clean(proxy: Proxy) -> None:
    for bad in (_entry(1, "gamma"), _entry(10**6, "alpha"), _entry(1, proxy.arms[1], segment=9)):
        proxy.handle(PEER, messages.LossReport(id="x", entries=[bad]))
    proxy.handle(PEER, messages.LossReport(id="y", entries=[_entry(1, proxy.arms[1])]))
    proxy.close()
    again = _again(proxy)  # would fail with "unknown arm" had the first one been written
    try:
        assert again.durable_step == 1 and again.max_segment == 1
    finally:
        again.close()
    proxy.close = lambda: None  # already closed


# ---- who may speak for the trainer (issue 24, item 3) ------------------------------------------

#: A process that holds the run's trainer lock until its stdin closes: a trainer life elsewhere.
_LOCK_HOLDER = (
    "import sys; from pathlib import Path; from andrea.daemon.rundir.layout import claim; "
    "lock = claim(Path(sys.argv[1]), 'trainer'); print('ready', flush=True); sys.stdin.read()"
)


def _eval(step: int) -> EvalEntry:
    arms = {"alpha": ArmEval(loss=0.01, sequences=4, tokens=256)}
    return EvalEntry(step=step, segment=1, phase=0, arms=arms, seconds=0.1, wall_time=1.0)


def _records(run_dir: Path) -> list[bytes]:
    names = (LOSS_FILE, STATE_FILE, EVAL_FILE, SAMPLES_FILE)
    return [(run_dir / n).read_bytes() if (run_dir / n).exists() else b"" for n in names]


def _stranger_hello(proxy: Proxy, **kw) -> messages.Hello:
    return trainer_hello(proxy.opts.cfg, "x", **{"life": "0badc0de" * 4, **kw})


def test_a_second_life_never_displaces_the_live_trainer(proxy: Proxy) -> None:
    run_dir = proxy.run_dir
    _run_steps(proxy, 3)
    before = _records(run_dir)
    for hello in (
        _stranger_hello(proxy),
        _stranger_hello(proxy, resume_step=0, segment=1),
        _stranger_hello(proxy, pid=None, life=None),
    ):
        reply = proxy.handle(b"stranger", hello)
        assert isinstance(reply, messages.Reply) and reply.error.startswith(
            messages.TRAINER_ALIVE
        ), reply
        assert f"pid {os.getpid()}" in reply.error
    for msg in (
        messages.LossReport(id="l", entries=[_entry(4, "alpha", loss=0.01)]),
        messages.EvalReport(id="e", entry=_eval(3)),
        messages.SampleReport(id="s", step=3, segment=1, phase=0, samples=[]),
    ):
        reply = proxy.handle(b"stranger", msg)
        assert isinstance(reply, messages.Reply) and reply.error.startswith(
            messages.UNKNOWN_PEER
        ), reply
    assert _records(run_dir) == before
    assert (proxy.max_segment, proxy.trainer_step) == (1, 3)
    # The live life itself, on a new socket (a reconnect): welcomed back, its records taken.
    welcome = proxy.handle(b"again", trainer_hello(proxy.opts.cfg, "h3", segment=1))
    assert isinstance(welcome, messages.Welcome) and welcome.segment == 1
    (a,) = proxy.handle(
        b"again", messages.AssignRequest(id="a", segment=1, from_step=4, count=1)
    ).items
    assert isinstance(
        proxy.handle(b"again", messages.LossReport(id="l", entries=[_entry(4, a.arm)])),
        messages.LossAck,
    )


def test_a_new_life_begins_once_the_old_one_is_gone(tmp_path: Path) -> None:
    p = _proxy(tmp_path)
    old = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert old.stdout.readline() == "ready\n"
        first = p.handle(b"old", trainer_hello(p.opts.cfg, pid=old.pid, life="01d" * 8))
        assert isinstance(first, messages.Welcome) and first.segment == 1
        # This process does not hold the lock, and the old life is alive: refused either way.
        for hello in (trainer_hello(p.opts.cfg), trainer_hello(p.opts.cfg, pid=old.pid)):
            reply = p.handle(b"new", hello)
            assert isinstance(reply, messages.Reply) and reply.error.startswith(
                messages.TRAINER_ALIVE
            )
        old.stdin.close()
        old.wait(timeout=30)
        # Gone, but the lock names a dead process: still nobody may begin a life.
        reply = p.handle(b"new", trainer_hello(p.opts.cfg))
        assert (
            isinstance(reply, messages.Reply)
            and "does not hold this run's trainer lock" in reply.error
        )
        life = play_trainer(tmp_path)  # held for as long as this life lives, as a trainer's is
        welcome = p.handle(b"new", trainer_hello(p.opts.cfg, resume_step=0))
        assert isinstance(welcome, messages.Welcome) and welcome.segment == 2
        reply = p.handle(b"old", messages.LossReport(id="l", entries=[_entry(1, "alpha")]))
        assert isinstance(reply, messages.Reply) and reply.error.startswith(messages.UNKNOWN_PEER)
        p.close()
        # A restarted proxy still knows the live life: a stranger is refused, the life welcomed.
        again = _proxy(tmp_path)
        try:
            reply = again.handle(b"x", _stranger_hello(again))
            assert isinstance(reply, messages.Reply) and reply.error.startswith(
                messages.TRAINER_ALIVE
            )
            welcome = again.handle(b"t", trainer_hello(again.opts.cfg, segment=2))
            assert isinstance(welcome, messages.Welcome) and welcome.segment == 2
        finally:
            again.close()
            life.close()
    finally:
        if old.poll() is None:
            old.kill()
            old.wait()


# ---- files that contradict each other (item 9) ------------------------------------------------


def _run_steps(proxy: Proxy, n: int, loss=lambda step, arm: 3.0) -> None:
    """Train `n` steps as a genuine trainer would: ask, then report."""
    for step in range(1, n + 1):
        (a,) = proxy.handle(
            PEER, messages.AssignRequest(id="a", segment=1, from_step=step, count=1)
        ).items
        entry = _entry(step, a.arm, loss=loss(step, a.arm))
        ack = proxy.handle(PEER, messages.LossReport(id="l", entries=[entry]))
        assert isinstance(ack, messages.LossAck), ack


def test_state_of_another_seed_is_moved_aside(proxy: Proxy, caplog) -> None:
    _run_steps(proxy, 12)
    proxy.close()
    state = json.loads((proxy.run_dir / STATE_FILE).read_text())
    state["bandit"]["seed"] += 1
    (proxy.run_dir / STATE_FILE).write_text(json.dumps(state))
    again = _again(proxy)
    try:
        assert "bandit seed" in caplog.text and "is not run.toml's seed" in caplog.text
        assert again.book.bandit.seed == again.opts.cfg.seed and again.durable_step == 12
        assert list(proxy.run_dir.glob(".state.json.corrupt-*"))
    finally:
        again.close()
    proxy.close = lambda: None


def _falling(step: int, arm: str) -> float:
    """Losses that fall, each arm at its own pace, with some noise: every statistic moves."""
    return 4.0 - (0.02 if arm == "alpha" else 0.01) * step + 0.05 * math.sin(step)


def _edited_state(proxy: Proxy, edit) -> Proxy:
    """Train 70 steps (the persisted snapshot is then past step 32), stop, apply `edit` to the
    state file's JSON, and restart the proxy."""
    _run_steps(proxy, 70, _falling)
    proxy.close()
    proxy.close = lambda: None
    path = proxy.run_dir / STATE_FILE
    state = json.loads(path.read_text())
    assert state["bandit"]["last_step"] >= 32
    edit(state["bandit"])
    path.write_text(json.dumps(state))
    return _again(proxy)


def _arms_after(p: Proxy, first: int, last: int) -> list[str]:
    return [
        a.arm
        for a in p.handle(
            PEER, messages.AssignRequest(id="n", segment=1, from_step=first, count=last - first + 1)
        ).items
    ]


def _set(field: str, value: object):
    def edit(bandit: dict) -> None:
        if field in bandit:
            bandit[field] = value
        else:
            bandit["arms"][0][field] = value

    return edit


@pytest.mark.parametrize(
    "field,value,says",
    [
        ("phase", 5, "is not a phase of this run"),
        ("progress_sum", 1000.0, "replaying .loss.json"),
        ("ema_reward", 2.5, "replaying .loss.json"),
        ("loss_best", -1.0, "replaying .loss.json"),
        ("fruitless", 10**30, "cannot exceed its pulls"),
        ("progress_sum", 1e30, "less than or equal"),
    ],
)
def test_an_edited_state_is_moved_aside_and_rebuilt_from_the_log(
    tmp_path: Path, field: str, value: object, says: str, caplog
) -> None:
    """A state file whose numbers the log does not give (a phase no pivot started, one edited
    statistic) is damaged: moved aside, and the bandit rebuilt by replaying the log, so the
    assignments that follow are those of the unedited run."""
    clean = _proxy(tmp_path / "clean", "gated-learnability-2")
    lock = play_trainer(clean.run_dir)
    assert isinstance(clean.handle(PEER, trainer_hello(clean.opts.cfg)), messages.Welcome)
    _run_steps(clean, 70, _falling)
    expected = _arms_after(clean, 71, 75)
    clean.close()
    lock.close()

    edited = _proxy(tmp_path / "edited", "gated-learnability-2")
    lock = play_trainer(edited.run_dir)
    assert isinstance(edited.handle(PEER, trainer_hello(edited.opts.cfg)), messages.Welcome)
    again = _edited_state(edited, _set(field, value))
    try:
        assert says in caplog.text and "rebuilding the bandit from .loss.json" in caplog.text
        assert list(edited.run_dir.glob(".state.json.corrupt-*"))
        assert again.durable_step == 70 and again.book.bandit.phase == 0
        assert isinstance(
            again.handle(PEER, trainer_hello(again.opts.cfg, segment=2)), messages.Welcome
        )
        assert _arms_after(again, 71, 75) == expected
    finally:
        again.close()
        lock.close()


def test_an_untouched_state_is_trusted(proxy: Proxy, caplog) -> None:
    """The check against the log passes on the state the proxy wrote itself (no false alarm)."""
    caplog.set_level(logging.INFO)
    again = _edited_state(proxy, lambda bandit: None)
    try:
        assert not list(proxy.run_dir.glob(".state.json.corrupt-*")), caplog.text
        assert "bandit restored from .state.json" in caplog.text
    finally:
        again.close()


def test_state_ahead_of_a_truncated_log_is_moved_aside(proxy: Proxy, caplog) -> None:
    _run_steps(proxy, 12)
    proxy.close()
    (proxy.run_dir / LOSS_FILE).unlink()  # the log is gone; .state.json still says step 12
    again = _again(proxy)
    try:
        assert "ends at step 0" in caplog.text and again.durable_step == 0
    finally:
        again.close()
    proxy.close = lambda: None


def test_log_that_lacks_checkpointed_steps_is_refused(proxy: Proxy) -> None:
    _run_steps(proxy, 12)
    proxy.close()
    write_checkpoint(proxy.run_dir, 12, mixing="proxy")
    log_bytes = (proxy.run_dir / LOSS_FILE).read_bytes()
    lines = log_bytes.split(b"\n")  # "[", then one entry a line: keep the first two
    (proxy.run_dir / LOSS_FILE).write_bytes(
        b"\n".join([*lines[:2], lines[2].rstrip(b",")]) + b"\n]\n"
    )
    (proxy.run_dir / STATE_FILE).unlink()
    before = _durable_files(proxy.run_dir)
    with pytest.raises(LogContradiction, match=r"lacks the losses of \d+ steps \(\d+-12\)"):
        _again(proxy)
    assert _durable_files(proxy.run_dir) == before
    proxy.close = lambda: None


@pytest.mark.parametrize("name", [STATE_FILE, SAMPLES_FILE])
@pytest.mark.parametrize("kind", ["directory", "dev-zero", "negative-kept"])
def test_unreadable_state_or_samples_is_moved_aside(tmp_path: Path, name: str, kind: str) -> None:
    path = tmp_path / name
    if kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        path.write_text('{"format": "andrea-samples/1", "kept": -5, "records": []}')
    p = _proxy(tmp_path)
    try:
        assert list(tmp_path.glob(f"{name}.corrupt-*"))
        assert p.samples.kept > 0
    finally:
        p.close()


def _durable_files(run_dir: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.suffix == ".json"
    }


# ---- the trainer's side: a refused hello asked again, an unknown link said hello again -----------


class _Served:
    """A proxy on its real socket, served by a thread of this process."""

    def __init__(self, run_dir: Path, policy: Policy | None = None) -> None:
        self.flags = OperatorRequests()
        self.ready = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(run_dir, policy or Policy(lag=2)), daemon=True
        )
        self.thread.start()
        assert self.ready.wait(30)

    def _run(self, run_dir: Path, policy: Policy) -> None:
        p = Proxy(ProxyOptions(run_dir, text_arms_config(run_dir), policy), self.flags)
        p.setup()
        self.ready.set()
        try:
            p.serve()
        finally:
            p.close()

    def stop(self) -> None:
        self.flags.request_stop("sigterm")
        self.thread.join(30)


def _until(ask: Callable[[], T | None], within: float = 30) -> T | None:
    """What `ask` answers, asked again (each ask waits for a reply a moment) for up to `within` s."""
    deadline = time.monotonic() + within
    while (got := ask()) is None and time.monotonic() < deadline:
        pass
    return got


def _assigned(link: ProxyLink, step: int, within: float = 30) -> messages.Assignment | None:
    """The arm of `step`, asked for as the trainer does (each wait ends at any reply)."""
    return _until(lambda: link.assignment(step, timeout=0.25), within)


def test_the_trainer_link_waits_for_the_old_life_and_says_hello_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = text_arms_config(tmp_path)
    old = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    served = None
    link = ProxyLink(peer_endpoint(tmp_path, "proxy"), 0, cfg.seed, ["alpha", "beta"])
    try:
        assert old.stdout.readline() == "ready\n"
        served = _Served(tmp_path)
        first = request(
            peer_endpoint(tmp_path, "proxy"),
            trainer_hello(cfg, pid=old.pid, life="01d" * 8),
            timeout=10,
        )
        assert isinstance(first, messages.Welcome), first
        # A trainer that starts while the previous life still exits is refused, and asks again.
        link.start()
        with caplog.at_level(logging.WARNING):
            assert _assigned(link, 1, within=2.5) is None
            assert "refused this trainer for now" in caplog.text and link.refused is None
        old.stdin.close()
        old.wait(timeout=30)
        with play_trainer(tmp_path):
            a = _assigned(link, 1)
        assert a is not None and link.segment == 2
        link.submit_loss(_entry(1, a.arm, segment=2))
        assert link.wait_acknowledged(30)
        # A restarted proxy does not know the link's socket (ZeroMQ reconnected it by itself): the
        # records it refuses are sent again after a hello, which the live life passes.
        served.stop()
        served = _Served(tmp_path)
        a = _assigned(link, 2)
        assert a is not None
        caplog.clear()
        with caplog.at_level(logging.INFO):
            link.submit_loss(_entry(2, a.arm, segment=2))
            assert link.wait_acknowledged(30)
        assert "saying hello again" in caplog.text and link.refused is None
    finally:
        link.close()
        if served is not None:
            served.stop()
        if old.poll() is None:
            old.kill()
            old.wait()


def _sink_arm(sink: ProxySink, step: int, within: float = 30) -> int | None:
    """The arm the trainer's sink gives `step`, asked for as the training loop does."""
    return _until(lambda: sink.arm_for(step), within)


def test_a_trainer_past_a_manual_pivot_takes_no_arm_of_the_new_phase_before_rolling_back(
    tmp_path: Path,
) -> None:
    """The seed's manual pivot while the trainer runs ahead of the boundary. The restarted proxy
    can answer an assignment request that the link queued before its hello, with the arms of the
    new phase (seen under systemd: the trainer trained them on top of the old phase's steps, then
    waited for ever). The trainer's sink gives no such arm until the trainer has rolled back to
    the boundary, whichever reply told of the pivot."""
    cfg = text_arms_config(tmp_path)
    names = ["alpha", "beta"]
    served = _Served(tmp_path)
    link = ProxyLink(peer_endpoint(tmp_path, "proxy"), 0, cfg.seed, names)
    counters = Counters()
    sink = ProxySink(link, counters, {n: i for i, n in enumerate(names)})
    try:
        with play_trainer(tmp_path):
            link.start()
            for step in range(1, 7):
                arm = _sink_arm(sink, step)
                assert arm is not None, f"no arm for step {step}"
                counters.step = step
                link.submit_loss(_entry(step, names[arm], segment=counters.segment))
            assert link.wait_acknowledged(30)
            write_checkpoint(tmp_path, 6, mixing="proxy")
            served.stop()
            # The operator's new policy (beta capped at 0), and the proxy started again with it:
            # a manual pivot after step 6, the newest checkpoint. The trainer has step 7's arm in
            # hand; step 8, within the lag of the boundary, needs no loss of the new phase.
            served = _Served(tmp_path, Policy(lag=2, arms={"beta": ArmBounds(cap=0.0)}))
            deadline = time.monotonic() + 30
            while sink.rollback_target(counters.step, counters.phase) is None:
                arm = sink.arm_for(counters.step + 1)
                if arm is not None:  # an arm prefetched before the stop: the trainer runs ahead
                    assert counters.phase == 0, "an arm of the new phase on the old phase's steps"
                    counters.step += 1
                    link.submit_loss(_entry(counters.step, names[arm], segment=counters.segment))
                assert time.monotonic() < deadline, "the trainer never heard of the pivot"
            ahead = counters.step
            assert ahead > 6 and sink.rollback_target(ahead, 0) == (1, 6)
            assert _sink_arm(sink, ahead + 1, within=1.0) is None
            assert (counters.step, counters.phase) == (ahead, 0)
            # The roll-back (PhaseFollower.follow): the trainer is at the boundary in a new segment, and
            # the new phase's arms are taken from there on.
            counters.step = 6
            sink.restart_after(6, new_segment=True)
            assert _sink_arm(sink, 7) == names.index("alpha")
            assert counters.phase == 1
    finally:
        link.close()
        served.stop()
