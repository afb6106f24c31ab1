"""The fast checkpoint path and the background writer: hashing fused with the write, ordering, at
most one write in flight, no torn files, SIGTERM/SIGKILL during an in-flight write, bit-exact resume.

Process tests use real trainer processes and real signals. To land a signal inside a write every
time (a tiny-preset write takes a few milliseconds), they set ANDREA_CKPT_TEST_WRITE_DELAY: the
writer pauses that long after the payload's bytes are written and before its fsync and rename —
the window in which a crash or a stop is most dangerous.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.writer import (
    BackgroundWriter,
    StagingBuffer,
    read_payload_into,
    write_payload,
)

# ---- the I/O engine -------------------------------------------------------------------------------


def test_write_payload_hash_is_the_files_sha256(tmp_path: Path) -> None:
    data = np.random.default_rng(0).integers(
        0, 256, 3 * (8 << 20) + 12345, dtype=np.uint8
    )  # not chunk-aligned
    digest = write_payload(tmp_path / "x.bin", data)
    assert (
        digest
        == hashlib.sha256((tmp_path / "x.bin").read_bytes()).hexdigest()
        == hashlib.sha256(data).hexdigest()
    )
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_failed_write_leaves_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    data = np.zeros(20 << 20, dtype=np.uint8)
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, buf) -> int:  # the second chunk hits a full disk
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, buf)

    monkeypatch.setattr(os, "write", failing_write)
    with pytest.raises(OSError, match="No space"):
        write_payload(target, data)
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_read_payload_into_reuses_buffer_and_checks_length(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, (8 << 20) + 7, dtype=np.uint8)
    (tmp_path / "x.bin").write_bytes(data.tobytes())
    buf = np.zeros(data.size + 100, dtype=np.uint8)
    arr, digest = read_payload_into(tmp_path / "x.bin", data.size, buf)
    assert digest == hashlib.sha256(data).hexdigest()
    assert np.shares_memory(arr, buf) and np.array_equal(arr, data)
    with pytest.raises(ValueError, match="shrank"):
        read_payload_into(tmp_path / "x.bin", data.size + 1, buf)


def test_staging_buffer_is_a_copy_in_payload_order() -> None:
    ws = [torch.randn(3, 4), torch.randn(5)]
    ms = [torch.randn(3, 4), torch.randn(5)]
    vs = [torch.rand(3, 4), torch.rand(5)]
    st = StagingBuffer(17)
    payload = st.fill(7, ws, ms, vs)
    assert payload.size == checkpoint_format.payload_size(17)
    expected = checkpoint_format.HEADER.pack(7, 17) + b"".join(
        t.numpy().tobytes() for t in (*ws, *ms, *vs)
    )
    for t in (*ws, *ms, *vs):
        t.add_(1.0)  # training goes on: the staged bytes must not move
    assert payload.tobytes() == expected


# ---- the background writer ------------------------------------------------------------------------


def test_background_writer_runs_one_job_at_a_time_in_order() -> None:
    w = BackgroundWriter()
    events: list[str] = []
    active = threading.Semaphore(1)

    def job(i: int):
        def run() -> None:
            assert active.acquire(blocking=False), "two jobs in flight"
            events.append(f"start {i}")
            time.sleep(0.05)
            events.append(f"end {i}")
            active.release()

        return run

    for i in range(4):
        w.submit(job(i), label=i)  # waits for the job in flight: never skipped, never overlapping
    w.close()
    assert events == [f"{e} {i}" for i in range(4) for e in ("start", "end")]


def test_background_writer_reraises_unexpected_errors_on_wait() -> None:
    w = BackgroundWriter()
    w.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        w.wait()
    w.wait()  # delivered once
    w.close()


# ---- real trainer processes, real signals -------------------------------------------------------
