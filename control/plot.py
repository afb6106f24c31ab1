"""A loss curve as a self-contained SVG: no plotting library, any number of points.

Long curves are reduced to the minimum and maximum of each horizontal pixel bucket, which keeps
every spike visible (a plain stride would drop them) while the file stays small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

import numpy as np

WIDTH, HEIGHT, PAD = 900, 360, 48


def _buckets(x: np.ndarray, y: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    if len(x) <= 2 * n:
        return x, y
    edges = np.linspace(0, len(x), n + 1).astype(int)
    xs, ys = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        seg = y[a:b]
        i, j = a + int(np.argmin(seg)), a + int(np.argmax(seg))
        for k in sorted((i, j)):
            xs.append(x[k])
            ys.append(y[k])
    return np.asarray(xs), np.asarray(ys)


def loss_svg(
    steps: Sequence[int] | np.ndarray, losses: Sequence[float] | np.ndarray, title: str = ""
) -> str:
    """An SVG of loss against step. Non-finite losses are drawn as red ticks on the x axis."""
    x = np.asarray(steps, dtype=np.float64)
    y = np.asarray(losses, dtype=np.float64)
    bad = ~np.isfinite(y)
    xf, yf = _buckets(x[~bad], y[~bad], WIDTH - 2 * PAD)
    x0, x1 = float(x.min()), float(max(x.max(), x.min() + 1))
    y0, y1 = (float(yf.min()), float(yf.max())) if len(yf) else (0.0, 1.0)
    if y1 - y0 < 1e-9:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def px(v: float) -> float:
        return PAD + (v - x0) / (x1 - x0) * (WIDTH - 2 * PAD)

    def py(v: float) -> float:
        return HEIGHT - PAD - (v - y0) / (y1 - y0) * (HEIGHT - 2 * PAD)

    points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(xf, yf))
    ticks = "".join(
        f'<text x="{PAD - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>'
        for v in np.linspace(y0, y1, 5)
    )
    xticks = "".join(
        f'<text x="{px(v):.1f}" y="{HEIGHT - PAD + 16}" text-anchor="middle">{int(round(v))}</text>'
        for v in np.linspace(x0, x1, 6)
    )
    nan_marks = "".join(
        f'<line x1="{px(v):.1f}" x2="{px(v):.1f}" y1="{HEIGHT - PAD}" y2="{HEIGHT - PAD - 8}" stroke="red"/>'
        for v in x[bad][:1000]
    )
    label = escape(
        f"{title} — {len(steps)} steps, last loss {losses[-1]:.4f}"
        if math.isfinite(losses[-1])
        else title
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}"'
        ' font-family="sans-serif" font-size="11">'
        f'<rect width="100%" height="100%" fill="white"/>'
        f'<text x="{PAD}" y="20" font-size="13">{label}</text>'
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="black"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="black"/>'
        f"{ticks}{xticks}{nan_marks}"
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="1" points="{points}"/>'
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 10}" text-anchor="middle">step</text></svg>'
    )
