"""A checkpoint's manifest checked against what else fixes its fields, before a resume trusts it.

`content_sha256` detects damage: an edit that does not recompute it. It does not authenticate:
whoever can write the run directory can change a field and recompute the hash as
docs/checkpoint-format.md defines it. So a resume cross-checks what something else fixes:

- Adam's step count: one AdamW update per training step, so `optimizer.adam_step` is `step` (plus
  the source's count for a run started with `--init-from-optimizer`), and the scheduler's
  `last_step` is `step`; the scheduler's rates are the schedule's at that step, under its
  own parameters, which are the manifest config's.
- Each data cursor (single-process manifests) whose arm the checkpoint's own segment drew: the batch
  it drew last must be the one the run recorded. The newest step of that arm on the checkpoint's
  trajectory — in `.loss.json` (of each step, the entry of the checkpoint's segment or the newest
  segment before it) or among the manifest's pending records — carries `batch_sha256`; rewinding the cursor
  by that step's chunks and drawing again, in the data order of the manifest's seed, must give the
  same digest. Only a draw of the same segment is comparable: a restart (a new segment) may change
  the seed or reset a cursor (`--allow-config-change`), and does so before its first step.

A contradiction makes the checkpoint damaged: it is skipped with the reason, like any other. What a
re-signed manifest can still change is listed in docs/checkpoint-format.md.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import OptimConfig
from andrea.daemon.data.arms import ArmStream, CursorState
from andrea.daemon.rundir.losslog import LossCurve, LossLogError, read_columns
from andrea.daemon.trainer.schedule import lr_at
from andrea.protocol.lossentry import LossEntry

log = logging.getLogger(__name__)

#: Adam keeps its step count as a float32: it counts every step exactly up to 2**24.
EXACT_ADAM_STEPS = 2**24


def inherited_adam_steps(m: Manifest) -> int | None:
    """Adam's step count a run started with: 0, or with `--init-from-optimizer` the source's (its
    manifest is recorded whole); None when the recorded source does not say."""
    source = m.lineage.init_from if m.lineage is not None else None
    if source is None or not source.optimizer:
        return 0
    optimizer = (m.source_manifest or {}).get("optimizer")
    count = optimizer.get("adam_step") if isinstance(optimizer, dict) else None
    return count if isinstance(count, int) and count >= 0 else None


def schedule_problems(m: Manifest) -> list[str]:
    """Adam's step count and the scheduler against the step and the manifest's config."""
    out = []
    inherited = inherited_adam_steps(m)
    expected = None if inherited is None else m.step + inherited
    if expected is None:
        out.append(
            "lineage.init_from says Adam's state came too, but the source manifest has no step count"
        )
    elif expected <= EXACT_ADAM_STEPS and m.optimizer.adam_step != expected:
        why = f"{expected}: step {m.step} after the {inherited}" if inherited else f"step {m.step}"
        out.append(
            f"optimizer.adam_step {m.optimizer.adam_step} is not {why} (one AdamW update per step)"
        )
    s = m.scheduler
    if s.last_step != m.step:
        out.append(f"scheduler.last_step {s.last_step} is not step {m.step}")
    params = {k: getattr(s, k) for k in ("lr", "min_lr", "warmup_steps", "decay_steps")}
    configured: dict[str, Any] = m.config.get("optim", {}) if isinstance(m.config, dict) else {}
    for k, v in params.items():
        if k in configured and configured[k] != v:
            out.append(f"scheduler.{k} {v} is not the config's {configured[k]}")
    try:
        optim = OptimConfig(**params)
    except ValueError:
        return out + [f"scheduler parameters {params} are not a schedule"]
    for name, at in (("last_lr", m.step), ("next_lr", m.step + 1)):
        if not math.isclose(getattr(s, name), lr_at(at, optim), rel_tol=1e-12):
            out.append(f"scheduler.{name} {getattr(s, name)} is not the schedule's at step {at}")
    return out


@dataclass(frozen=True)
class Drawn:
    """The newest step of an arm on a checkpoint's trajectory: what it drew, if recorded."""

    step: int
    segment: int
    tokens: int
    batch_sha256: str | None


def newest_draws(
    log_columns: LossCurve | None, pending: list[LossEntry], step: int, segment: int
) -> dict[str, Drawn]:
    """Per arm, its newest step up to `step` on the trajectory of `segment`: of each step, the
    entry of the newest segment not after `segment` (last in file order among equals); the
    manifest's `pending` records count as logged."""
    newest: dict[str, tuple[int, int, Drawn]] = {}

    def offer(s: int, seg: int, arm: str, tokens: int, digest: str | None) -> None:
        if s <= step and seg <= segment and (s, seg) >= newest.get(arm, (0, 0, None))[:2]:
            newest[arm] = (s, seg, Drawn(s, seg, tokens, digest))

    if log_columns is not None and len(log_columns):
        c = log_columns
        rows = np.nonzero((c.step <= step) & (c.segment <= segment))[0]
        order = rows[np.lexsort((rows, c.segment[rows], c.step[rows]))]
        steps = c.step[order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = steps[1:] != steps[:-1]
        trajectory = order[last]  # one row per step, by step
        for arm in set(c.arm[trajectory]):
            i = trajectory[c.arm[trajectory] == arm][-1]
            offer(int(c.step[i]), int(c.segment[i]), arm, int(c.tokens[i]), c.batch_sha256[i])
    for e in pending:
        offer(e.step, e.segment, e.arm, e.tokens, e.batch_sha256)
    return {arm: d for arm, (_, _, d) in newest.items()}


def replayed_digest(stream: ArmStream, seed: int, cursor: CursorState, chunks: int) -> str | None:
    """The digest of the last `chunks` chunks before `cursor` in the data order of `seed` (token ids
    as little-endian int64, rows in the order drawn: `batch_sha256`'s rule); None when the cursor
    has not drawn that many."""
    drawn = cursor.epoch * cursor.n_chunks + cursor.position
    if drawn < chunks:
        return None
    replay = ArmStream(stream.arm, seed, stream.stride, stream.shifted)
    replay.epoch, replay.position = divmod(drawn - chunks, cursor.n_chunks)
    return hashlib.sha256(replay.next_batch(chunks).astype("<i8").tobytes()).hexdigest()


class CrossCheck:
    """The checks of a manifest against the run's records (`.loss.json`, read once when first
    needed; a log that cannot be read leaves the cursors unchecked) and its data streams."""

    def __init__(self, log_path: Path, streams: list[ArmStream]) -> None:
        self.log_path = log_path
        self.streams = {s.arm.name: s for s in streams}
        self._columns: LossCurve | None = None
        self._read = False

    def problems(self, m: Manifest) -> list[str]:
        return schedule_problems(m) + self._cursor_problems(m)

    def _log(self) -> LossCurve | None:
        if not self._read:
            self._read = True
            try:
                self._columns = read_columns(self.log_path)
            except FileNotFoundError:
                pass
            except (OSError, LossLogError, ValueError, OverflowError) as e:
                log.info("data cursors not checked against %s: %s", self.log_path.name, e)
        return self._columns

    def _cursor_problems(self, m: Manifest) -> list[str]:
        seed = m.config.get("seed") if isinstance(m.config, dict) else None
        if m.distributed is not None or not isinstance(seed, int):
            return []  # a job's cursors are each rank's: the job's data layout decides
        segment = m.progress.segment
        draws = newest_draws(self._log(), m.pending_losses, m.step, segment)
        out = []
        for cursor in m.data:
            stream, drawn = self.streams.get(cursor.name), draws.get(cursor.name)
            if (
                stream is None
                or drawn is None
                or drawn.segment != segment
                or drawn.batch_sha256 is None
                or cursor.identity != stream.arm.identity
                or cursor.n_chunks != stream.n_chunks
                or drawn.tokens % stream.stride
            ):
                continue  # nothing comparable to check it against (or the resume check reports it)
            digest = replayed_digest(stream, seed, cursor, drawn.tokens // stream.stride)
            if digest != drawn.batch_sha256:
                out.append(
                    f"arm {cursor.name!r}: cursor {cursor.epoch}:{cursor.position} does not follow "
                    f"the batch that step {drawn.step} drew (its batch_sha256 in the records)"
                )
        return out
