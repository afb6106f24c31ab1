"""Held-out evaluation: each arm's loss on a fixed set of sequences it was never trained on.

The evaluation must not perturb training, so that a run with it is bit-identical, in every
weight, to the same run without it:
- the model runs in eval mode (dropout off, so no random draw at all) under `torch.no_grad`,
  and its training mode is restored afterwards;
- the sequences are fixed at start-up from the held-out tokens (`heldout.eval_starts`), read
  from no data cursor and drawn from no generator;
- nothing is written to a parameter, a gradient or the optimizer.

A stop request is checked between batches: an evaluation in progress is abandoned at once (it
is repeated after the resume, see `Trainer`), never allowed to delay a stop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from andrea.daemon.data.arms import Arm
from andrea.daemon.data.heldout import eval_starts
from andrea.daemon.model import GPT
from andrea.daemon.trainer.platform.precision import NumericMode

log = logging.getLogger(__name__)

#: Sequences of each target arm's held-out data in a probe (the transfer reward's,
#: docs/bandit.md): evenly spaced over its held-out tokens, as the evaluation's are.
PROBE_SEQUENCES = 4


@dataclass(frozen=True)
class ArmResult:
    loss: float
    sequences: int
    tokens: int


@dataclass(frozen=True)
class EvalResult:
    losses: dict[str, ArmResult]
    seconds: float


class Evaluator:
    """The fixed evaluation set of a run, and the loop that scores a model on it."""

    def __init__(
        self,
        arms: list[Arm],
        block_size: int,
        sequences: int,
        batch_size: int,
        device: torch.device,
    ) -> None:
        self.batch_size = batch_size
        self.sets: dict[str, torch.Tensor] = {}
        offsets = np.arange(block_size + 1, dtype=np.int64)
        for arm in arms:
            if arm.heldout is None or arm.heldout.shape[0] == 0:
                continue  # nothing held out: said once, when the arm was loaded
            starts = eval_starts(int(arm.heldout.shape[0]), block_size, sequences)
            if len(starts) == 0:
                log.warning(
                    "arm %s: its held-out documents hold less than one sequence of %d tokens; "
                    "it is not evaluated",
                    arm.name,
                    block_size + 1,
                )
                continue
            if len(starts) < sequences:
                log.warning(
                    "arm %s: only %d held-out sequences (of %d asked for)",
                    arm.name,
                    len(starts),
                    sequences,
                )
            rows = arm.heldout[starts[:, None] + offsets].astype(np.int64)
            self.sets[arm.name] = torch.from_numpy(rows).to(device)

    def __bool__(self) -> bool:
        return bool(self.sets)

    def evaluate(
        self, model: GPT, numerics: NumericMode, should_stop: Callable[[], bool]
    ) -> EvalResult | None:
        """Each arm's mean held-out loss (nats per token); None if a stop request arrived."""
        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        out: dict[str, ArmResult] = {}
        try:
            with torch.no_grad():
                for name, rows in self.sets.items():
                    total = 0.0
                    for i in range(0, rows.shape[0], self.batch_size):
                        if should_stop():
                            return None
                        xy = rows[i : i + self.batch_size]
                        with numerics.autocast(xy.device):
                            _, loss = model(xy[:, :-1], xy[:, 1:])
                        total += float(loss.item()) * xy.shape[0]
                    n = int(rows.shape[0])
                    out[name] = ArmResult(total / n, n, n * (int(rows.shape[1]) - 1))
        finally:
            model.train(was_training)
        return EvalResult(out, time.perf_counter() - t0)


class Prober:
    """The transfer reward's probe of some target arms: PROBE_SEQUENCES fixed held-out sequences
    of each, scored in one forward pass (one call rather than one per arm: on a CPU at
    andrea-tiny a call costs more than its rows). Like `Evaluator`, it draws from no generator
    and touches no weight; unlike it, nothing cuts it short, since a step's record must carry the
    same probe in every run of that step. An arm without held-out data is left out."""

    def __init__(self, arms: list[Arm], block_size: int, device: torch.device) -> None:
        offsets = np.arange(block_size + 1, dtype=np.int64)
        rows, self.names, self.counts = [], [], []
        for arm in arms:
            if arm.heldout is None or arm.heldout.shape[0] == 0:
                continue
            starts = eval_starts(int(arm.heldout.shape[0]), block_size, PROBE_SEQUENCES)
            if len(starts) == 0:
                continue
            rows.append(arm.heldout[starts[:, None] + offsets].astype(np.int64))
            self.names.append(arm.name)
            self.counts.append(len(starts))
        self.rows = torch.from_numpy(np.concatenate(rows)).to(device) if rows else None

    def probe(self, model: GPT, numerics: NumericMode) -> tuple[dict[str, float], float]:
        """Each arm's mean loss on its probe sequences (nats per token), and the seconds taken."""
        t0 = time.perf_counter()
        if self.rows is None:
            return {}, 0.0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), numerics.autocast(self.rows.device):
                logits, _ = model(self.rows[:, :-1])
                per_token = F.cross_entropy(
                    logits.float().reshape(-1, logits.size(-1)),
                    self.rows[:, 1:].reshape(-1),
                    reduction="none",
                )
        finally:
            model.train(was_training)
        per_row = per_token.view(self.rows.shape[0], -1).mean(dim=1).tolist()
        out, i = {}, 0
        for name, n in zip(self.names, self.counts):
            out[name] = math.fsum(per_row[i : i + n]) / n
            i += n
        return out, time.perf_counter() - t0
