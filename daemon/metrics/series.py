"""Series derived from the canonical loss curve, defined once for the plot, the exports and the daemons.

Every function takes numpy columns of a :class:`~andrea.daemon.rundir.losslog.LossCurve` (one row per step,
sorted by step) and returns one value per row, so that any claim a plot or a dashboard makes about a
step can be recomputed from ``.loss.json`` alone.
"""

from __future__ import annotations

import math

import numpy as np

#: Weight of the newest loss in the loss EMA: the trainer's progress line and status use the same.
EMA_WEIGHT = 0.1


def ema_update(previous: float | None, loss: float) -> float | None:
    """One step of the loss EMA. A non-finite loss is a recorded event, not a value to average:
    it leaves the EMA unchanged (the first finite loss starts it)."""
    if not np.isfinite(loss):
        return previous
    return loss if previous is None else (1.0 - EMA_WEIGHT) * previous + EMA_WEIGHT * loss


def loss_ema(loss: np.ndarray) -> np.ndarray:
    """The loss EMA after each row (NaN before the first finite loss), as :func:`ema_update` defines it."""
    # ema_update inlined: a recurrence has no exact numpy form once non-finite rows are skipped, and
    # a call per row doubled the time (about 70 ms for 200,000 rows as written here).
    keep, new, isfinite = 1.0 - EMA_WEIGHT, EMA_WEIGHT, math.isfinite
    value: float | None = None
    out = []
    for x in loss.tolist():
        if isfinite(x):
            value = x if value is None else keep * value + new * x
        out.append(math.nan if value is None else value)
    return np.array(out, dtype=np.float64)


def arm_loss_ema(loss: np.ndarray, arm: np.ndarray) -> np.ndarray:
    """Each row's arm's loss EMA after that row, over the rows of that arm only: the per-arm training
    loss curve (NaN before the arm's first finite loss). Same weight and rule as :func:`loss_ema`."""
    out = np.full(len(loss), np.nan)
    for name in np.unique(arm).tolist():
        rows = np.flatnonzero(arm == name)
        out[rows] = loss_ema(loss[rows])
    return out


def tokens_per_second(tokens: np.ndarray, wall_time: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """Throughput of each step: its tokens over the wall time since the previous step of the same
    segment. NaN for the first step of a segment (a restart's downtime is not training time) and
    where the clock did not advance."""
    out = np.full(len(tokens), np.nan)
    if len(tokens) < 2:
        return out
    dt = np.diff(wall_time)
    same = (segment[1:] == segment[:-1]) & (dt > 0)
    out[1:][same] = tokens[1:][same] / dt[same]
    return out


def rolling_share(arm: np.ndarray, names: list[str], window: int) -> dict[str, np.ndarray]:
    """For each arm name, the share of the last ``window`` rows (fewer at the start) that drew it."""
    n = len(arm)
    counted = np.minimum(np.arange(1, n + 1), window).astype(np.float64)
    shares = {}
    for name in names:
        hits = np.concatenate(([0], np.cumsum(arm == name)))
        lower = np.maximum(np.arange(1, n + 1) - window, 0)
        shares[name] = (hits[1:] - hits[lower]) / counted
    return shares


def phase_share(arm: np.ndarray, phase: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """For each arm name, its share of the rows of the current phase so far: the rows from the
    first of the row's phase up to the row, that drew it. A pivot starts every count again, so the
    last row of a phase holds the phase's share, the figure its policy's floors and caps bound."""
    n = len(arm)
    starts = np.flatnonzero(np.concatenate(([True], phase[1:] != phase[:-1])))
    first = starts[np.searchsorted(starts, np.arange(n), side="right") - 1]
    counted = (np.arange(n) - first + 1).astype(np.float64)
    shares = {}
    for name in names:
        hits = np.concatenate(([0], np.cumsum(arm == name)))
        shares[name] = (hits[1:] - hits[first]) / counted
    return shares


def default_window(rows: int) -> int:
    """The rolling window of the share panel: 1% of the rows shown, at least 20, at most 5,000."""
    return int(min(5000, max(20, rows // 100)))
