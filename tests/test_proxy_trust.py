"""The proxy's trust boundary (issue 12, item 2): every field of a `hello` or `losses` message is
checked against the proxy's own state before anything is written, and a rejected message changes
nothing — not .loss.json, not the bandit, not what a restarted proxy does."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from andrea.daemon.losslog import read_entries
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.proxy import LogContradiction, Proxy, ProxyOptions
from andrea.daemon.process import SignalFlags
from andrea.daemon.rundir import LOSS_FILE, SAMPLES_FILE, STATE_FILE
from andrea.protocol import messages as m
from andrea.protocol.lossentry import LossEntry

from .hostile import text_arms_config, write_checkpoint

pytestmark = pytest.mark.process  # binds a real ipc socket

PEER = b"trainer"


def _proxy(run_dir: Path, reward: str = "learnability") -> Proxy:
    policy = Policy(lag=2, reward=reward)
    p = Proxy(ProxyOptions(run_dir, text_arms_config(run_dir), policy), SignalFlags())
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


@pytest.fixture(params=["learnability", "loss"])
def proxy(tmp_path: Path, request: pytest.FixtureRequest):
    p = _proxy(tmp_path, request.param)
    welcome = p.handle(
        PEER, m.Hello(id="h", resume_step=0, seed=p.opts.cfg.seed, arms=["alpha", "beta"])
    )
    assert isinstance(welcome, m.Welcome) and welcome.segment == 1
    got = p.handle(PEER, m.AssignRequest(id="a", segment=1, from_step=1, count=2))
    p.arms = {a.step: a.arm for a in got.items}
    yield p
    p.close()


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
        PEER, m.LossReport(id="x", entries=[_entry(2, proxy.arms[2]), bad(proxy.arms)])
    )
    assert isinstance(reply, m.Reply) and not reply.ok and "losses rejected" in reply.error
    assert _durable(run_dir) == before
    # The trainer's genuine record for the same step is still taken: nothing was lost.
    ack = proxy.handle(PEER, m.LossReport(id="y", entries=[_entry(1, proxy.arms[1])]))
    assert isinstance(ack, m.LossAck) and ack.keys == [(1, 1)]
    assert [(e.step, e.arm) for e in read_entries(run_dir / LOSS_FILE)] == [(1, proxy.arms[1])]


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
        m.decode(frame)


def test_hello_with_an_unnumbered_segment_is_refused(proxy: Proxy) -> None:
    before = _durable(proxy.run_dir)
    reply = proxy.handle(
        PEER,
        m.Hello(
            id="h2", segment=40, resume_step=0, seed=proxy.opts.cfg.seed, arms=["alpha", "beta"]
        ),
    )
    assert isinstance(reply, m.Reply) and not reply.ok and "never numbered" in reply.error
    assert _durable(proxy.run_dir) == before


def test_restart_after_an_attack_is_clean(proxy: Proxy) -> None:
    for bad in (_entry(1, "gamma"), _entry(10**6, "alpha"), _entry(1, proxy.arms[1], segment=9)):
        proxy.handle(PEER, m.LossReport(id="x", entries=[bad]))
    proxy.handle(PEER, m.LossReport(id="y", entries=[_entry(1, proxy.arms[1])]))
    proxy.close()
    again = _again(proxy)  # would fail with "unknown arm" had the first one been written
    try:
        assert again.durable_step == 1 and again.max_segment == 1
    finally:
        again.close()
    proxy.close = lambda: None  # already closed


# ---- files that contradict each other (item 9) ------------------------------------------------


def _run_steps(proxy: Proxy, n: int) -> None:
    """Train `n` steps as a genuine trainer would: ask, then report."""
    for step in range(1, n + 1):
        (a,) = proxy.handle(PEER, m.AssignRequest(id="a", segment=1, from_step=step, count=1)).items
        ack = proxy.handle(PEER, m.LossReport(id="l", entries=[_entry(step, a.arm)]))
        assert isinstance(ack, m.LossAck), ack


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
