"""Where a step's micro-batches come from, and how they reach the device without holding it up.

The chunks of a step are drawn on the training thread when the step starts: that is what advances
an arm's cursor, which a checkpoint records, so it stays exactly where it was. Everything else is
done on one worker thread: the tokens of the chunks gathered, the step's digest computed, and on
CUDA the rows copied into pinned memory, from which the transfer to the device is asynchronous.
While a step trains, the worker already gathers the next step's batches for the arm the fixed
mixture will assign it; the next step uses them only if the chunks it draws are the same (a
guess that was wrong, or a cursor moved by a restore or a roll-back, costs one gather, never a
bit of the trajectory).

The digest (the loss record's ``batch_sha256``) is the SHA-256 of the int64 token ids of the step's
micro-batches over the whole job, in order, each a C-ordered (rows, block_size + 1) array: the same
bytes at any world size, the same value as before the gathering moved to the worker. Only rank 0,
which writes the record, computes it; the other ranks gather their own rows only.
"""

from __future__ import annotations

import copy
import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from andrea.daemon.trainer.parts import Parts
from andrea.daemon.trainer.platform.world import World


@dataclass(frozen=True)
class Drawn:
    """The chunks of one step: per micro-batch, the chunk indices of the job's whole micro-batch."""

    arm: int
    chunks: tuple[np.ndarray, ...]

    def same_as(self, other: Drawn) -> bool:
        return self.arm == other.arm and all(
            np.array_equal(a, b) for a, b in zip(self.chunks, other.chunks, strict=True)
        )


@dataclass(frozen=True)
class Gathered:
    """A step's tokens on the host: this rank's rows of each micro-batch (pinned on CUDA), and on
    rank 0 the step's digest."""

    rows: list[torch.Tensor]
    digest: str | None


class StepBatches:
    """One step's micro-batches, as the worker delivers them."""

    def __init__(self, drawn: Drawn, gathered: Future[Gathered], device: torch.device) -> None:
        self.drawn = drawn
        self._gathered = gathered
        self._device = device

    def micro(self, i: int) -> torch.Tensor:
        """This rank's (rows, block_size + 1) token ids of micro-batch `i`, on the device (the
        copy from pinned memory is queued, not waited for)."""
        return self._gathered.result().rows[i].to(self._device, non_blocking=True)

    def wait(self) -> None:
        """Until the step's tokens are gathered; what gathering them raised (TokensChanged)."""
        self._gathered.result()

    def digest(self) -> str | None:
        """Rank 0: the step's digest (see the module docstring); None on the other ranks."""
        return self._gathered.result().digest


class Batches:
    """Draws each step's chunks and hands the gathering to its worker thread."""

    def __init__(
        self, parts: Parts, world: World, device: torch.device, rows: int, micro_batches: int
    ) -> None:
        """`rows`: sequences of one micro-batch over the whole job; this rank trains on its
        `parts.local_batch` contiguous rows of them."""
        self.parts = parts
        self.device = device
        self.rows = rows
        self.micro_batches = micro_batches
        self.digests = world.is_main
        mine = parts.local_batch
        self._mine = slice(world.rank * mine, (world.rank + 1) * mine)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batches")
        self._ahead: tuple[Drawn, Future[Gathered]] | None = None

    def draw(self, arm: int) -> StepBatches:
        """Draw the next step's chunks of `arm` (advancing its cursor), and have them gathered:
        by now already, when the worker guessed this step right."""
        stream = self.parts.streams[arm]
        drawn = Drawn(arm, tuple(stream.next_chunks(self.rows) for _ in range(self.micro_batches)))
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0].same_as(drawn):
            return StepBatches(drawn, ahead[1], self.device)
        if ahead is not None:
            ahead[1].cancel()
        return StepBatches(drawn, self._pool.submit(self._gather, drawn), self.device)

    def prefetch(self, arm: int | None) -> None:
        """Start gathering what the next step will draw if its arm is `arm` (None: no guess)."""
        if arm is None:
            return
        # A copy: the real cursor moves only when the step draws.
        peek = copy.copy(self.parts.streams[arm])
        drawn = Drawn(arm, tuple(peek.next_chunks(self.rows) for _ in range(self.micro_batches)))
        self._ahead = (drawn, self._pool.submit(self._gather, drawn))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _gather(self, drawn: Drawn) -> Gathered:
        """On the worker thread: tokens, digest, pinned rows."""
        stream = self.parts.streams[drawn.arm]
        sha = hashlib.sha256() if self.digests else None
        rows = []
        for chunks in drawn.chunks:
            if sha is not None:
                tokens = stream.tokens_of(chunks)
                sha.update(tokens.data)
                mine = tokens[self._mine]
            else:
                mine = stream.tokens_of(chunks[self._mine])
            host = torch.from_numpy(mine)
            rows.append(host.pin_memory() if self.device.type == "cuda" else host)
        return Gathered(rows, sha.hexdigest() if sha is not None else None)
