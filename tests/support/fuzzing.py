"""The fuzz harness's shared parts (tests/unit/test_fuzz.py and tests/process/test_fuzz.py): the
hostile values, mutations of a JSON-like value or of bytes, the allocation bound, the proxy run
directory the cases start from, and for the links-and-FIFOs cases the stopped run with one of every
file a command reads, which command reads which (READERS), the planting of a link or a FIFO in
place of one, and the alarm that turns a blocked read into an exception."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.proxy import Proxy, ProxyOptions
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.protocol import messages
from andrea.protocol.lossentry import LossEntry
from tests.support.hostile import play_trainer, text_arms_config, trainer_hello, write_checkpoint

EXAMPLES = int(os.environ.get("ANDREA_FUZZ_EXAMPLES", "30"))
ALLOCATION_BOUND = 64 << 20
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

HOSTILE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "a" * 70000, "../other/step_000020.bin", "\x00", "é" * 40]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-3, 3), max_size=2),
)


# ---- mutations of a JSON-like value ------------------------------------------------------------


def paths(obj: Any, here: tuple = ()) -> Iterator[tuple]:
    """Every node's path; long lists contribute their first, second and last items only, so that
    the 624 words of an RNG state do not drown the other fields."""
    yield here
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, (*here, k))
    elif isinstance(obj, list):
        idx = range(len(obj)) if len(obj) <= 4 else (0, 1, len(obj) - 1)
        for i in idx:
            yield from paths(obj[i], (*here, i))


@st.composite
def mutations(draw: st.DrawFn, valid: Any) -> tuple[str, Any]:
    """(description, mutated copy) of `valid`: one node replaced, deleted or given an extra key."""
    where = draw(st.sampled_from([p for p in paths(valid) if p]))
    op = draw(st.sampled_from(["replace", "replace", "replace", "delete", "extra"]))
    out = copy.deepcopy(valid)
    parent = out
    for k in where[:-1]:
        parent = parent[k]
    key = where[-1]
    if op == "delete" and isinstance(parent, dict):
        del parent[key]
    elif op == "extra" and isinstance(parent, dict):
        parent["unknown_" + str(draw(st.integers(0, 9)))] = draw(HOSTILE)
    else:
        parent[key] = draw(HOSTILE)
    return f"{op} {'.'.join(map(str, where))}", out


def bounded(fn: Callable[[], Any]) -> Any:
    """Run `fn` and check that it allocated at most ALLOCATION_BOUND bytes at its peak."""
    tracemalloc.start()
    try:
        return fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= ALLOCATION_BOUND, f"allocated {peak:,} bytes"


def mutate_bytes(raw: bytes, data: st.DataObject, other: Callable[[bytearray, int], None]) -> bytes:
    """`raw` cut, grown by a few bytes or bit-flipped at a drawn offset, or changed there by
    `other` (the kind's own hostile growth)."""
    buf = bytearray(raw)
    at = data.draw(st.integers(0, len(buf)))
    op = data.draw(st.sampled_from(["cut", "insert", "flip", "other"]))
    if op == "cut":
        del buf[at:]
    elif op == "insert":
        buf[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    elif op == "flip" and at < len(buf):
        buf[at] ^= 1 << data.draw(st.integers(0, 7))
    else:
        other(buf, at)
    return bytes(buf)


def snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def build_proxy_run(d: Path) -> Path:
    """`d` made a proxy run directory with a valid .state.json and .samples.json (written by a
    real proxy, in this process, that served 12 steps and one sample report)."""
    p = Proxy(ProxyOptions(d, text_arms_config(d), Policy(lag=2)), OperatorRequests())
    p.setup()
    try:
        with play_trainer(d):
            p.handle(b"t", trainer_hello(p.opts.cfg))
        for step in range(1, 13):
            (a,) = p.handle(
                b"t", messages.AssignRequest(id="a", segment=1, from_step=step, count=1)
            ).items
            entry = LossEntry(
                step=step,
                loss=2.0,
                arm=a.arm,
                lr=1e-3,
                tokens=64,
                wall_time=1.0,
                segment=1,
                phase=0,
                batch_sha256=None,
            )
            p.handle(b"t", messages.LossReport(id="l", entries=[entry]))
        p.handle(
            b"t",
            messages.SampleReport(
                id="s", step=12, segment=1, phase=0, samples=[messages.Sample(prompt="a", text="b")]
            ),
        )
    finally:
        p.close()
    return d


ALARM_S = 60


PIVOT = "archive/pivot-000010-20250101T000000Z"


#: Each file (or directory) of the run, and the commands that read it.
READERS: dict[str, tuple[str, ...]] = {
    rundir.CONFIG_FILE: ("export", "verify-resume"),
    rundir.POLICY_FILE: ("export",),
    rundir.LOSS_FILE: ("status", "history", "plot", "metrics", "export"),
    rundir.EVAL_FILE: ("status", "history", "history --eval", "plot"),
    rundir.SAMPLES_FILE: ("samples", "export"),
    rundir.STATE_FILE: ("status", "plot", "export"),
    rundir.manifest_name(20): ("status", "checkpoints", "prune", "plot", "export"),
    rundir.bin_name(20): ("checkpoints", "prune", "export"),
    f"{PIVOT}/{rundir.PIVOT_RECORD}": ("plot", "checkpoints", "prune", "export"),
    f"{PIVOT}/{rundir.POLICY_FILE}": ("plot", "export"),
    f"{PIVOT}/{rundir.STATE_FILE}": ("plot", "export"),
    f"{PIVOT}/{rundir.SAMPLES_FILE}": ("export",),
    PIVOT: ("plot", "checkpoints", "export"),
    ".trainer.lock": ("status", "stop"),
    ".proxy.lock": ("status",),
    rundir.SOCKET_DIR_RECORD: ("status",),  # read while a trainer holds its lock
}


def build_stopped_run(run: Path, proxy_run: Path) -> Path:
    """`run` made a stopped run with one of every file a command reads: checkpoints, the loss and
    evaluation logs, `proxy_run`'s files, run.toml, policy.toml, a pivot archive, both locks,
    .socket-dir."""
    from andrea.daemon.config import save_config
    from andrea.daemon.rundir.evallog import ArmEval, EvalEntry, EvalLog

    run.mkdir()
    for step in (10, 20):
        write_checkpoint(run, step)
    for name in (rundir.LOSS_FILE, rundir.STATE_FILE, rundir.SAMPLES_FILE):
        (run / name).write_bytes((proxy_run / name).read_bytes())
    with EvalLog.open(run / rundir.EVAL_FILE) as log:
        arms = {"alpha": ArmEval(loss=2.5, sequences=4, tokens=256)}
        log.append(EvalEntry(step=10, segment=1, phase=0, arms=arms, seconds=0.5, wall_time=1e9))
    save_config(text_arms_config(proxy_run), run / rundir.CONFIG_FILE)
    (run / rundir.POLICY_FILE).write_text("lag = 2\n")
    archive = run / PIVOT
    archive.mkdir(parents=True)
    record = {"boundary_step": 10, "old_phase": 0, "new_phase": 1, "old_policy": "a" * 64,
              "new_policy": "b" * 64, "utc": "20250101T000000Z"}  # fmt: skip
    (archive / rundir.PIVOT_RECORD).write_text(json.dumps(record))
    (archive / rundir.POLICY_FILE).write_text("lag = 2\n")
    for name in (rundir.STATE_FILE, rundir.SAMPLES_FILE):
        (archive / name).write_bytes((run / name).read_bytes())
    for role in ("trainer", "proxy"):
        rundir.lock_path(run, role).write_bytes(b"")
    (run / rundir.SOCKET_DIR_RECORD).write_text(f"{run / rundir.SOCKET_DIR}\n")
    return run


def plant(run: Path, name: str, kind: str, outside: Path) -> list[Path]:
    """Replace ``run/name`` by a link to a copy of it in ``outside``, or by a FIFO; the files a
    link leads to, their access time set to the epoch."""
    path = run / name
    copied = outside / path.name
    if path.is_dir():
        shutil.copytree(path, copied)
        shutil.rmtree(path)
    else:
        shutil.copy2(path, copied)
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return []
    path.symlink_to(copied)
    targets = [p for p in copied.rglob("*") if p.is_file()] if copied.is_dir() else [copied]
    for t in targets:
        os.utime(t, (0, t.stat().st_mtime))
    return targets


class Blocked(Exception):
    pass


def within_alarm(fn: Callable[..., Any], *args: Any) -> Any:
    def ring(signum: int, frame: object) -> None:
        raise Blocked

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, ALARM_S)
    try:
        return fn(*args)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def atime_is_recorded(d: Path) -> bool:
    """Whether this filesystem records a read in the access time (relatime does, once the access
    time is older than the modification time); the link oracle relies on it."""
    probe = d / "probe"
    probe.write_text("x")
    os.utime(probe, (0, probe.stat().st_mtime))
    probe.read_text()
    return probe.stat().st_atime != 0
