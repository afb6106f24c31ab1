"""The canonical curve with its derived series as CSV or JSON Lines (``andreactl metrics export``).

One row per step, columns :data:`COLUMNS`: the ``.loss.json`` fields a spreadsheet or pandas wants,
plus ``loss_ema``, ``arm_loss_ema`` (the loss EMA of the step's arm over that arm's steps only:
grouped by ``arm``, the per-arm training loss curves) and ``tokens_per_second``
(:mod:`andrea.daemon.metrics.series`), and ``utc`` (the step's wall time in RFC 3339). A non-finite
loss is spelled as in ``.loss.json`` ("NaN", "Infinity", "-Infinity"); a missing EMA or rate is
empty (CSV) or null (JSON Lines).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from andrea.daemon.metrics.series import arm_loss_ema, loss_ema, tokens_per_second
from andrea.daemon.rundir.losslog import LossCurve

COLUMNS = (
    "step",
    "loss",
    "loss_ema",
    "lr",
    "arm",
    "arm_loss_ema",
    "tokens",
    "tokens_per_second",
    "segment",
    "phase",
    "wall_time",
    "utc",
)
_SPELLING = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _loss(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else _SPELLING[value]


def _optional(value: float) -> float | None:
    return None if math.isnan(value) else value


def rows(curve: LossCurve) -> Iterator[dict[str, Any]]:
    """Each step of ``curve`` as a dict of :data:`COLUMNS`."""
    ema = loss_ema(curve.loss).tolist()
    arm_ema = arm_loss_ema(curve.loss, curve.arm).tolist()
    tps = tokens_per_second(curve.tokens, curve.wall_time, curve.segment).tolist()
    cols = {
        name: getattr(curve, name).tolist()
        for name in ("step", "loss", "lr", "arm", "tokens", "segment", "phase", "wall_time")
    }
    for i in range(len(curve)):
        wall = cols["wall_time"][i]
        yield {
            "step": cols["step"][i],
            "loss": _loss(cols["loss"][i]),
            "loss_ema": _optional(ema[i]),
            "lr": cols["lr"][i],
            "arm": cols["arm"][i],
            "arm_loss_ema": _optional(arm_ema[i]),
            "tokens": cols["tokens"][i],
            "tokens_per_second": _optional(tps[i]),
            "segment": cols["segment"][i],
            "phase": cols["phase"][i],
            "wall_time": wall,
            "utc": datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds"),
        }


def write_csv(curve: LossCurve, out: Path) -> int:
    """Write ``curve`` as CSV with a header row into the new file ``out`` (never over an existing
    file, never through a link); returns the rows written."""
    n = 0
    with out.open("x", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows(curve):
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
            n += 1
    return n


def write_jsonl(curve: LossCurve, out: Path) -> int:
    """Write ``curve`` as JSON Lines (one object per step) into the new file ``out``; returns the
    rows written."""
    n = 0
    with out.open("x", encoding="utf-8") as f:
        for row in rows(curve):
            f.write(json.dumps(row, allow_nan=False, separators=(",", ":")) + "\n")
            n += 1
    return n
