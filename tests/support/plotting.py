"""What a readable axis is, for the plot tests: ticks evenly spaced by a round step (1, 2, 2.5 or
5 times a power of ten), each a whole multiple of it."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes


def is_round(value: float) -> bool:
    """1, 2, 2.5 or 5 times a power of ten."""
    mantissa = abs(value) / 10 ** math.floor(math.log10(abs(value)))
    return any(math.isclose(mantissa, m, rel_tol=1e-9) for m in (1, 2, 2.5, 5, 10))


def round_ticks(values: list[float]) -> bool:
    """Evenly spaced by a round step, each a whole multiple of it (not 1.38, 2.43 or 1087, 2173)."""
    steps = np.diff(values)
    if len(values) < 2 or not np.allclose(steps, steps[0]) or not is_round(steps[0]):
        return False
    return all(math.isclose(v / steps[0], round(v / steps[0]), abs_tol=1e-9) for v in values)


def tick_values(ax: Axes, axis: str) -> list[float]:
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    ticks = ax.get_xticks() if axis == "x" else ax.get_yticks()
    return [t for t in ticks if lo <= t <= hi]
