"""`.loss.json`: format, torn-tail repair at every byte, real kill -9, exactly-once, readers, locking."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from andrea.daemon.rundir.losslog import (
    LossLog,
    LossLogError,
    LossLogLocked,
    canonical_curve,
    last_entry,
    read_entries,
)
from tests.support.records import entry


def strict_json(raw: bytes) -> object:
    """json.loads that rejects NaN/Infinity literals, as jq and every non-Python parser do."""

    def reject(token: str) -> object:
        raise ValueError(f"non-standard JSON literal {token}")

    return json.loads(raw, parse_constant=reject)


# ---------------------------------------------------------------- model


# ---------------------------------------------------------------- format and round trip


# ---------------------------------------------------------------- torn tail at every byte


# ---------------------------------------------------------------- not a torn tail: refuse, touch nothing


# ---------------------------------------------------------------- read_curve: the canonical curve as columns


# ---------------------------------------------------------------- locking and failed writes


def test_second_writer_refused_readers_allowed(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    with LossLog.open(path) as log:
        log.append(entry(1))
        with pytest.raises(LossLogLocked, match="already open for writing"):
            LossLog.open(path)
        code = "import sys; from andrea.daemon.rundir.losslog import LossLog; LossLog.open(sys.argv[1])"
        child = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
        )
        assert child.returncode != 0 and "LossLogLocked" in child.stderr
        assert read_entries(path) == [entry(1)] and last_entry(path) == entry(1)
    with LossLog.open(path) as log:  # the lock goes with the writer
        assert len(log) == 1
    log.close()  # idempotent
    with pytest.raises(LossLogError, match="closed"):
        log.append(entry(2))


# ---------------------------------------------------------------- a real kill -9


CHILD = r"""
import sys
from andrea.daemon.rundir.losslog import LossLog, last_entry
from andrea.protocol.lossentry import LossEntry
path, every = sys.argv[1], int(sys.argv[2])
previous = last_entry(path) if __import__("os").path.exists(path) else None
segment = 1 if previous is None else previous.segment + 1
step = 0 if previous is None else previous.step
with LossLog.open(path) as log:
    print("ready", flush=True)
    while True:
        batch = []
        for _ in range(every):
            step += 1
            batch.append(LossEntry(step=step, loss=1.0 / step, arm="a" * (step % 64 + 1), lr=1e-3, tokens=64,
                                   wall_time=1.0, segment=segment, phase=0, batch_sha256=None))
        if step % 2:
            log.append_many(batch)
        else:
            for e in batch:
                log.append(e)
        log.sync()
        print(step, flush=True)  # only after sync: the proxy's acknowledgement
"""


@pytest.mark.slow
def test_sigkill_at_a_random_moment_keeps_every_synced_entry(tmp_path: Path) -> None:
    path = tmp_path / ".loss.json"
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    acked: list[int] = []
    for life in range(1, 4):
        previous = last_entry(path) if path.exists() else None
        first = 1 if previous is None else previous.step + 1
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(rng.choice([1, 7, 100]))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n", child.stderr.read() if child.stderr else b""
        time.sleep(rng.uniform(0.05, 0.5))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL
        lines = child.stdout.read().split(b"\n")
        child.stdout.close()
        child.stderr.close()  # type: ignore[union-attr]
        synced = [int(x) for x in lines if x.strip().isdigit()]
        acked.append(synced[-1] if synced else first - 1)

        entries = read_entries(path)
        keys = {(e.segment, e.step) for e in entries}
        # every acknowledged (synced) step of this life is there, in this life's segment
        missing = [s for s in range(first, acked[-1] + 1) if (life, s) not in keys]
        assert not missing, f"seed={seed} life={life} lost synced steps {missing[:5]}"
        with LossLog.open(path) as log:
            assert len(log) == len(entries)
        strict_json(path.read_bytes())
    curve = canonical_curve(read_entries(path))
    assert [e.step for e in curve] == list(range(1, len(curve) + 1)), f"seed={seed}"
    assert curve[-1].step >= acked[-1]
