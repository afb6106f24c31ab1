"""The audit plot, checked on the figure object: every panel and mark on a real run with restarts, a
pivot, a zombie arm and an audit checkpoint; spikes kept at 200,000 steps; round ticks; step ranges."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from andrea.control.plot import audit_figure, reduce_minmax
from andrea.control.run_events import PhaseSpan, RunEvents
from andrea.daemon.metrics.series import rolling_share
from andrea.daemon.mixing.policy import parse_policy
from andrea.daemon.rundir.losslog import LossCurve
from tests.support.plotting import round_ticks, tick_values


def panels(fig: Figure) -> dict[str, Axes]:
    return {ax.get_gid().removeprefix("panel:"): ax for ax in fig.axes if ax.get_gid()}


def by_gid(ax: Axes, gid: str) -> list:
    return [a for a in ax.get_children() if a.get_gid() == gid]


def synthetic_curve(n: int, spikes: dict[int, float]) -> LossCurve:
    rng = np.random.default_rng(3)
    loss = 3.0 + rng.normal(0, 0.05, n)
    for s, v in spikes.items():
        loss[s - 1] = v
    return curve_of(loss, ["a", "b"] * (n // 2), [0] * n)


def curve_of(loss: np.ndarray, arms: list[str], phases: list[int]) -> LossCurve:
    """A loss curve of steps 1..n with these losses, arms and phases (the rest constant)."""
    n = len(loss)
    step = np.arange(1, n + 1, dtype=np.int64)
    return LossCurve(
        step=step,
        loss=loss,
        arm=np.array(arms, dtype=object),
        lr=np.full(n, 1e-3),
        tokens=np.full(n, 512, dtype=np.int64),
        wall_time=1.7e9 + step.astype(np.float64),
        segment=np.ones(n, dtype=np.int64),
        phase=np.array(phases, dtype=np.int64),
        batch_sha256=np.full(n, None, dtype=object),
        entries_read=n,
    )


def test_spikes_stay_visible_at_200k_steps() -> None:
    # A moderate spike stays on the line; a huge one is marked above the clipped axis.
    curve = synthetic_curve(200_000, {123_457: 3.3, 170_001: 90.0, 99_999: math.nan})
    fig = audit_figure(curve, RunEvents())
    loss = panels(fig)["loss"]
    (line,) = by_gid(loss, "loss")
    xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
    assert len(xs) <= 4000
    (at,) = np.flatnonzero(ys == 3.3)  # the maximum of its bucket, drawn at the bucket's end
    assert xs[at - 1] <= 123_457 <= xs[at] and xs[at] - xs[at - 1] < 200
    assert loss.get_ylim()[1] < 90.0, "one spike must not flatten the curve"
    (spike,) = by_gid(loss, "spike")
    assert list(spike.get_xdata()) == [170_001]
    (bad,) = by_gid(loss, "nonfinite")
    assert [seg[0][0] for seg in bad.get_segments()] == [99_999]
    assert round_ticks(tick_values(loss, "x")) and round_ticks(tick_values(loss, "y"))
    assert loss.xaxis.get_major_formatter()(150_000, 0) == "150K"


def test_minmax_reduction_keeps_every_extreme() -> None:
    rng = np.random.default_rng(5)
    y = rng.normal(size=100_003)
    x = np.arange(len(y), dtype=np.float64)
    xs, ys = reduce_minmax(x, y, buckets=1000)
    assert len(xs) == 2000 and ys.max() == y.max() and ys.min() == y.min()
    assert np.all(np.diff(xs) >= 0)


def mixed_curve(arms: list[str], phases: list[int]) -> LossCurve:
    """A loss curve of the given arms and phases, each arm at its own slowly falling loss."""
    n = len(arms)
    step = np.arange(1, n + 1, dtype=np.int64)
    base = {"comments": 4.0, "code": 3.0}
    loss = np.array([base[a] - s / 1000 for a, s in zip(arms, step.tolist())])
    return curve_of(loss, arms, phases)


def test_arm_share_shows_a_floor_the_phase_meets_as_met() -> None:
    # Phase 0 floors `comments` at 0.40 and meets it: 24 of its first 40 steps, then 8 of the next
    # 40, 32 of 80 in all. A 20-step rolling share falls to 0.20 in the second half; the share of
    # the phase so far never falls below 0.40. Phase 1 (no bounds) starts its count afresh.
    first = (["comments"] * 3 + ["code"] * 2) * 8
    second = (["comments"] + ["code"] * 4) * 8
    after = ["code"] * 10 + ["comments"] * 10
    curve = mixed_curve(first + second + after, [0] * 80 + [1] * 20)
    assert rolling_share(curve.arm, ["comments"], 20)["comments"][:80].min() == 0.2
    policy = parse_policy("[arms.comments]\nfloor = 0.40\n\n[arms.code]\ncap = 0.60\n")
    events = RunEvents(phases=[PhaseSpan(0, 1, 80, policy), PhaseSpan(1, 81, 100, None)])
    p = panels(audit_figure(curve, events))
    assert list(p) == ["loss", "arm loss", "arm share", "learning rate"]
    share = p["arm share"]
    (comments,) = by_gid(share, "share:comments")
    (code,) = by_gid(share, "share:code")
    xs, ys = np.asarray(comments.get_xdata()), np.asarray(comments.get_ydata())
    in_phase0 = xs <= 80
    assert ys[in_phase0].min() == pytest.approx(0.40) and ys[xs == 80] == pytest.approx(0.40)
    assert np.asarray(code.get_ydata())[in_phase0].max() == pytest.approx(0.60)
    # Broken between the phases, and counted from phase 1's own first step.
    assert np.isnan(ys[np.flatnonzero(xs == 80)[0] + 1])
    assert list(ys[xs > 80]) == [0.0] * 10 + [i / (10 + i) for i in range(1, 11)]
    assert "phase" in share.get_ylabel() and "phase" in share.get_legend().get_title().get_text()
    (band,) = by_gid(share, "band:comments:0")
    assert band.get_paths()[0].vertices[:, 1].min() == pytest.approx(0.40)

    # A zoom into the second half of phase 0 shows the same shares, counted from the phase start.
    zoom = panels(audit_figure(curve, events, since=41, until=80))["arm share"]
    (zoomed,) = by_gid(zoom, "share:comments")
    np.testing.assert_array_equal(zoomed.get_ydata(), ys[(xs >= 41) & (xs <= 80)])


def test_arm_loss_panel_is_each_arms_ema_over_its_own_steps() -> None:
    arms = ["code", "comments", "code", "code", "comments", "code"]
    curve = mixed_curve(arms, [0] * 6)
    arm_loss = panels(audit_figure(curve, RunEvents()))["arm loss"]
    for name in ("code", "comments"):
        (line,) = by_gid(arm_loss, f"arm_loss:{name}")
        steps = [s for s, a in enumerate(arms, 1) if a == name]
        assert list(line.get_xdata()) == steps
        ema, want = None, []
        for s in steps:
            x = curve.loss[s - 1]
            ema = x if ema is None else 0.9 * ema + 0.1 * x
            want.append(ema)
        np.testing.assert_allclose(line.get_ydata(), want, rtol=1e-12)
    assert "per arm" in arm_loss.get_ylabel()
    # A run of one arm has neither per-arm panel.
    single = mixed_curve(["code"] * 4, [0] * 4)
    assert list(panels(audit_figure(single, RunEvents()))) == ["loss", "learning rate"]


@pytest.mark.parametrize("boundary", [20, 60, 92])
def test_no_legend_covers_a_pivot_label(boundary: int, tmp_path: Path) -> None:
    """Issue 33, A6: the loss panel's legend sat over the pivot labels (upper right, where a pivot
    late in the run puts its label). Checked on the drawn extents, and rendered to PNG."""
    from andrea.control.plot import save_figure
    from andrea.control.run_events import Pivot

    arms = (["comments"] * 3 + ["code"] * 2) * 20
    phases = [0] * boundary + [1] * (100 - boundary)
    curve = mixed_curve(arms, phases)
    events = RunEvents(
        pivots=[Pivot(boundary, 1, "ab12cd34" * 8)],
        restarts=[(1, 1), (41, 2)],
        audit_checkpoints=[(30, "sigusr1")],
        phases=[PhaseSpan(0, 1, boundary, None), PhaseSpan(1, boundary + 1, 100, None)],
    )
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = audit_figure(curve, events, title="pivot")
    save_figure(fig, tmp_path / "pivot.png")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    (label,) = by_gid(panels(fig)["loss"], "pivot-label:1")
    box = label.get_window_extent(renderer)
    for ax in panels(fig).values():
        legend = ax.get_legend()
        if legend is not None:
            assert not legend.get_window_extent(renderer).overlaps(box), ax.get_gid()
