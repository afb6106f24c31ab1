"""The fuzz harness's shared parts (tests/unit/test_fuzz.py and tests/process/test_fuzz.py): the
hostile values, mutations of a JSON-like value or of bytes, the allocation bound, and the proxy
run directory the cases start from."""

from __future__ import annotations

import copy
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.proxy import Proxy, ProxyOptions
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.protocol import messages
from andrea.protocol.lossentry import LossEntry

from .hostile import play_trainer, text_arms_config, trainer_hello

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
