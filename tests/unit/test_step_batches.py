"""A step's batches (daemon/trainer/batch_loader.py) and a checkpoint's staging copy: the same chunks,
tokens and digest as drawing them in line, whether the worker guessed the step right or not; and on
CUDA, the pinned rows, the copy to host memory on its own stream and the update that waits for it
(skipped without a GPU; scripts/gpu_check.py runs them)."""

from __future__ import annotations

import copy
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from andrea.daemon.checkpoint.writer import StagingBuffer
from andrea.daemon.data.arms import Arm, ArmStream
from andrea.daemon.trainer.batch_loader import Batches
from andrea.daemon.trainer.platform.world import World

BLOCK, ROWS, ACCUM = 16, 4, 2


def streams() -> list[ArmStream]:
    rng = np.random.default_rng(0)
    arms = [Arm(f"a{i}", f"id{i}", rng.integers(0, 256, 5_000, dtype=np.uint8)) for i in range(2)]
    return [ArmStream(a, seed=7, block_size=BLOCK) for a in arms]


def batches(world: World, device: str = "cpu") -> tuple[Batches, list[ArmStream]]:
    s = streams()
    parts = SimpleNamespace(streams=s, local_batch=ROWS // world.size)
    return Batches(parts, world, torch.device(device), ROWS, ACCUM), s  # type: ignore[arg-type]


def in_line(reference: list[ArmStream], arm: int) -> tuple[list[np.ndarray], str]:
    """What the step drew before the worker existed: next_batch per micro-batch, hashed as it went."""
    sha = hashlib.sha256()
    out = []
    for _ in range(ACCUM):
        batch = reference[arm].next_batch(ROWS)
        sha.update(batch.tobytes())
        out.append(batch)
    return out, sha.hexdigest()


@pytest.mark.parametrize("guesses", [[0, 1, 1, 0], [1, 1, 0, None], [None] * 4])
def test_same_tokens_digest_and_cursors_as_drawing_in_line(guesses: list[int | None]) -> None:
    b, live = batches(World())
    reference = streams()
    try:
        for arm, guess in zip([0, 1, 1, 0], guesses, strict=True):
            step = b.draw(arm)
            b.prefetch(guess)
            expected, digest = in_line(reference, arm)
            for i in range(ACCUM):
                assert torch.equal(step.micro(i), torch.from_numpy(expected[i]))
            assert step.digest() == digest
            assert [s.state_dict() for s in live] == [s.state_dict() for s in reference]
    finally:
        b.close()


class Counting(ArmStream):
    """An arm's stream that counts the gathers of its tokens."""

    gathers = 0

    def tokens_of(self, chunks: np.ndarray) -> np.ndarray:
        self.gathers += 1
        return super().tokens_of(chunks)


def test_a_right_guess_is_gathered_once_and_a_moved_cursor_is_followed() -> None:
    b, live = batches(World())
    live[1] = Counting(live[1].arm, seed=7, block_size=BLOCK)
    try:
        b.draw(0)
        b.prefetch(1)
        b.draw(1).micro(ACCUM - 1)
        assert live[1].gathers == ACCUM  # the worker's, ahead of the step; none at the step
        b.prefetch(1)
        live[1].position = (live[1].position + 3) % live[1].n_chunks  # as a restore would
        expected = copy.copy(live[1]).tokens_of(copy.copy(live[1]).next_chunks(ROWS))
        assert torch.equal(b.draw(1).micro(0), torch.from_numpy(expected))
    finally:
        b.close()


def test_each_rank_gets_its_rows_and_only_rank_0_the_digest() -> None:
    reference = streams()
    expected, digest = in_line(reference, 0)
    for rank in range(2):
        b, _ = batches(World(rank=rank, size=2, local_rank=rank, local_size=2))
        try:
            step = b.draw(0)
            rows = slice(rank * ROWS // 2, (rank + 1) * ROWS // 2)
            for i in range(ACCUM):
                assert torch.equal(step.micro(i), torch.from_numpy(expected[i][rows]))
            assert step.digest() == (digest if rank == 0 else None)
        finally:
            b.close()


def test_cpu_staging_is_done_when_fill_returns() -> None:
    buf = StagingBuffer(10)
    w, m, v = torch.arange(10.0), torch.ones(10), torch.zeros(10)
    buf.fill(3, [w], [m], [v])
    buf.guard()
    w.add_(1)
    buf.ready()
    assert torch.equal(buf.flat[:10], torch.arange(10.0)) and buf.staged_seconds is not None


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_cuda_staging_copies_aside_and_the_update_waits_for_it() -> None:
    n = 64 << 20  # 256 MB a tensor: a copy long enough for an unguarded update to overtake it
    w, m, v = (torch.randn(n, device="cuda") for _ in range(3))
    expected = torch.cat([w, m, v]).cpu()
    buf = StagingBuffer(n, torch.device("cuda", 0))
    buf.fill(1, [w], [m], [v])
    buf.guard()
    for t in (w, m, v):
        t.mul_(2)  # what the optimizer does next, queued on the compute stream
    buf.ready()
    assert torch.equal(buf.flat, expected)
    assert buf.staged_seconds is not None and buf.staged_seconds > 0


@cuda
def test_cuda_batches_are_pinned_and_land_on_the_device() -> None:
    b, _ = batches(World(), "cuda")
    try:
        step = b.draw(0)
        assert all(r.is_pinned() for r in step._gathered.result().rows)
        assert step.micro(0).device.type == "cuda"
    finally:
        b.close()
