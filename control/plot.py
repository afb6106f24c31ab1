"""The audit plot of a run (``andreactl plot``): stacked panels sharing the step axis, drawn with matplotlib.

Panels, top to bottom (:data:`PANELS`; a new panel is one more row there):

- **loss**: the canonical loss of every step and its EMA (:mod:`andrea.daemon.metrics.series`), with
  non-finite losses ticked in red on the axis and spikes above the shown range marked at the top;
- **arm loss**: each arm's training loss EMA over the steps trained on it, one line per arm (the
  loss the bandit sees per arm; only when the run mixes more than one arm);
- **arm share**: each arm's share of the steps of its phase so far (the count starts again at each
  pivot, so the line ends each phase at the phase's share), with each phase's floor and cap drawn as
  bands in the arm's colour (only when the run mixes more than one arm). A rolling share over a
  short window would cross bounds that the phase as a whole meets: the bounds are on the bandit's
  probabilities, and a realised share over N steps strays from them by about sqrt(p (1 - p) / N);
- **held-out loss**: each arm's loss on its held-out sequences at every evaluation (``.eval.json``,
  see docs/evaluation.md) and their mean, in the arms' colours (only when the run has evaluations);
- **learning rate**.

Every panel carries the vertical marks of :mod:`andrea.control.run_events`: restarts (segment starts),
pivots (labelled with the new phase and its policy fingerprint), audit checkpoints and zombie arms.

Long curves are drawn as the minimum and maximum of each of :data:`BUCKETS` step buckets: every spike
stays visible (a plain stride would drop it) and 200,000 steps draw as fast as 4,000. Artists carry a
``gid`` naming what they show (``loss``, ``ema``, ``restart``, ``pivot``, ``audit``, ``zombie``,
``arm_loss:ARM``, ``share:ARM``, ``band:ARM:PHASE``, ``heldout:ARM``, ``heldout:mean``, ``lr``, ...) so that tests and
scripts can check the figure itself.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator
from matplotlib.typing import LineStyleType

from andrea.control.run_events import RunEvents
from andrea.daemon.metrics.series import arm_loss_ema, loss_ema, phase_share
from andrea.daemon.rundir.losslog import LossCurve
from andrea.protocol.evalentry import EvalEntry

#: Buckets of the min/max reduction: about one per horizontal pixel of the default figure.
BUCKETS = 2000
#: Output formats, chosen by the file's extension.
FORMATS = ("png", "svg", "pdf")
#: Round tick steps (1, 2, 2.5, 5 times a power of ten), the same on every axis.
ROUND_STEPS = [1, 2, 2.5, 5, 10]

MARKS: dict[str, tuple[str, LineStyleType, str]] = {
    # kind: (colour, line style, legend label)
    "restart": ("0.35", (0, (4, 3)), "restart (new segment)"),
    "pivot": ("tab:purple", "-", "pivot (phase, policy)"),
    "audit": ("tab:green", (0, (1, 2)), "audit checkpoint"),
    "zombie": ("tab:red", (0, (6, 2, 1, 2)), "zombie arm (last draw)"),
}


@dataclass(frozen=True)
class PlotView:
    """What the panels draw: the selected rows of the canonical curve and the run's events in range."""

    curve: LossCurve
    events: RunEvents
    ema: np.ndarray
    x_range: tuple[int, int]
    arms: list[str]  # every arm drawn, zombies' and policies' included
    # Per row, computed over the whole curve before the range is cut (as `ema`):
    arm_ema: np.ndarray  # the row's arm's loss EMA over that arm's rows
    shares: dict[str, np.ndarray]  # each arm's share of the rows of its phase so far
    evals: Sequence[EvalEntry] = ()  # canonical evaluations within x_range

    def colours(self) -> dict[str, str]:
        """Each arm's colour, the same on every panel."""
        return {n: f"C{i % 10}" for i, n in enumerate(self.arms)}


@dataclass(frozen=True)
class Panel:
    name: str
    height: float  # relative height
    shown: Callable[[PlotView], bool]
    draw: Callable[[Axes, PlotView], None]


def reduce_minmax(
    x: np.ndarray, y: np.ndarray, buckets: int = BUCKETS
) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with each bucket of rows replaced by its minimum then its maximum (at the bucket's first
    and last x); the rows themselves when there are fewer than two per bucket. Non-finite ``y`` is
    ignored (a bucket of only non-finite rows gives NaN, a gap in the line)."""
    if len(x) <= 2 * buckets:
        return x, y
    starts = np.linspace(0, len(x), buckets + 1).astype(np.int64)[:-1]
    finite = np.where(np.isfinite(y), y, np.nan)
    with np.errstate(invalid="ignore"):
        lo = np.fmin.reduceat(finite, starts)
        hi = np.fmax.reduceat(finite, starts)
    ends = np.append(starts[1:], len(x)) - 1
    xs = np.column_stack((x[starts], x[ends])).ravel()
    ys = np.column_stack((lo, hi)).ravel()
    return xs, ys


def _stride(
    x: np.ndarray, y: np.ndarray, points: int = 2 * BUCKETS
) -> tuple[np.ndarray, np.ndarray]:
    """Every k-th row of a smooth series (rolling shares, EMA), always keeping the last."""
    if len(x) <= points:
        return x, y
    idx = np.unique(np.append(np.linspace(0, len(x) - 1, points).astype(np.int64), len(x) - 1))
    return x[idx], y[idx]


def _step_label(value: float, _pos: int | None = None) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}K"
    return f"{value:g}"


def _draw_marks(ax: Axes, view: PlotView, labels: bool) -> None:
    ev = view.events
    lo, hi = view.x_range
    # Each mark sits between the step before and the step after the event, so at boundary + 0.5.
    positions = {
        "restart": [s - 0.5 for s, _ in ev.restarts],
        "pivot": [p.step + 0.5 for p in ev.pivots],
        "audit": [float(s) for s, _ in ev.audit_checkpoints],
        "zombie": [z.step - 0.5 for z in ev.zombies],
    }
    for kind, xs in positions.items():
        xs = [x for x in xs if lo - 1 <= x <= hi + 1]
        if not xs:
            continue
        colour, style, _ = MARKS[kind]
        ax.vlines(
            xs,
            0,
            1,
            transform=ax.get_xaxis_transform(),
            colors=colour,
            linestyles=style,
            linewidth=1.0,
            gid=kind,
            zorder=2 if kind == "restart" else 1,
        )
    if not labels:
        return
    for p in ev.pivots:
        if lo <= p.step <= hi:
            ax.annotate(
                f"phase {p.phase}\n{p.policy_fingerprint[:8]}",
                (p.step + 0.5, 1.0),
                xycoords=ax.get_xaxis_transform(),
                xytext=(3, -3),
                textcoords="offset points",
                va="top",
                fontsize=7,
                color=MARKS["pivot"][0],
                gid=f"pivot-label:{p.phase}",
            )
    for z in ev.zombies:
        if lo <= z.step <= hi + 1:
            ax.annotate(
                f"zombie {z.arm}",
                (z.step - 0.5, 0.0),
                xycoords=ax.get_xaxis_transform(),
                xytext=(3, 3),
                textcoords="offset points",
                fontsize=7,
                color=MARKS["zombie"][0],
                gid=f"zombie-label:{z.arm}",
            )


def _mark_spikes(ax: Axes, x: np.ndarray, loss: np.ndarray) -> None:
    """One huge spike would flatten the whole curve: clip the axis above the bulk and mark the
    spikes beyond it at the top edge, each with its value, so that none disappears."""
    finite = loss[np.isfinite(loss)]
    if not len(finite):
        return
    low, q, high = np.quantile(finite, [0.0, 0.999, 1.0])
    if not (high > q + 2 * (q - low) and q > low):
        return
    top = q + 0.5 * (q - low)
    ax.set_ylim(low - 0.05 * (top - low), top)
    over = np.flatnonzero(loss > top)
    ax.plot(
        x[over],
        np.full(len(over), top),
        linestyle="none",
        marker="^",
        color="tab:red",
        markersize=5,
        clip_on=False,
        label="spike above the axis",
        gid="spike",
    )
    for i in over[np.argsort(loss[over])[::-1][:5]]:
        ax.annotate(
            f"{loss[i]:.3g}",
            (x[i], top),
            xytext=(2, -9),
            textcoords="offset points",
            fontsize=7,
            color="tab:red",
        )


#: Every panel's legend stands to the right of its axes, in a margin kept for it: inside, it covered
#: the pivot labels along the top and the newest steps of the curves.
LEGEND_MARGIN = 0.83
LEGEND_OUTSIDE: dict = dict(
    loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, fontsize=7, framealpha=0.85
)


def _legend_with_marks(ax: Axes, events: RunEvents) -> None:
    """The panel's legend, with an entry for each kind of mark the run has."""
    handles, _ = ax.get_legend_handles_labels()
    kinds = {
        "restart": events.restarts,
        "pivot": events.pivots,
        "audit": events.audit_checkpoints,
        "zombie": events.zombies,
    }
    for kind, present in kinds.items():
        if present:
            colour, style, label = MARKS[kind]
            handles.append(Line2D([], [], color=colour, linestyle=style, label=label))
    ax.legend(handles=handles, **LEGEND_OUTSIDE)


def _draw_loss(ax: Axes, view: PlotView) -> None:
    c = view.curve
    x = c.step.astype(np.float64)
    xs, ys = reduce_minmax(x, c.loss)
    ax.plot(xs, ys, color="tab:blue", linewidth=0.6, alpha=0.55, label="loss", gid="loss")
    ex, ey = _stride(x, view.ema)
    ax.plot(ex, ey, color="tab:orange", linewidth=1.4, label="loss EMA", gid="ema")
    _mark_spikes(ax, x, c.loss)
    bad = np.flatnonzero(~np.isfinite(c.loss))
    if len(bad):
        ax.vlines(
            x[bad],
            0,
            0.04,
            transform=ax.get_xaxis_transform(),
            colors="red",
            linewidth=1.0,
            label=f"non-finite loss ({len(bad)})",
            gid="nonfinite",
        )
    ax.set_ylabel("loss (nats/token)")
    _legend_with_marks(ax, view.events)


def _arm_names(curve: LossCurve, events: RunEvents) -> list[str]:
    # A set of the list: np.unique would sort 200,000 Python strings.
    names = set(curve.arm.tolist()) | {z.arm for z in events.zombies}
    for phase in events.phases:
        if phase.policy is not None:
            names |= set(phase.policy.arms)
    return sorted(names)


def _draw_arm_loss(ax: Axes, view: PlotView) -> None:
    c = view.curve
    colours = view.colours()
    x = c.step.astype(np.float64)
    for name in view.arms:
        rows = np.flatnonzero(c.arm == name)
        if not len(rows):
            continue  # a zombie or a policy's arm that trained nothing in range
        sx, sy = _stride(x[rows], view.arm_ema[rows])
        ax.plot(sx, sy, color=colours[name], linewidth=1.1, label=name, gid=f"arm_loss:{name}")
    ax.set_ylabel("training loss EMA\nper arm (nats/token)")
    _arm_legend(ax, view, "EMA over the arm's own steps")


def _arm_legend(ax: Axes, view: PlotView, title: str) -> None:
    """One entry per arm, titled with what the lines are (and over which window)."""
    # Wrapped to the margin's width (about 30 characters at this size).
    ax.legend(title=textwrap.fill(title, 30), title_fontsize=7, **LEGEND_OUTSIDE)


def _phase_rows(phase: np.ndarray) -> list[np.ndarray]:
    """The row indices of each run of equal phases, in order."""
    cuts = np.flatnonzero(phase[1:] != phase[:-1]) + 1
    return np.split(np.arange(len(phase)), cuts)


def _draw_bounds(ax: Axes, view: PlotView, colours: dict[str, str]) -> None:
    """Every phase's floor and cap of each arm: a band between dashed lines."""
    lo, hi = view.x_range
    for phase in view.events.phases:
        first, last = max(phase.first_step, lo), min(phase.last_step, hi)
        if phase.policy is None or first > last:
            continue
        for name in view.arms:
            bounds = phase.policy.arms.get(name)
            if bounds is None or (bounds.floor == 0.0 and bounds.cap == 1.0):
                continue
            ax.fill_between(
                [first, last],
                bounds.floor,
                bounds.cap,
                color=colours[name],
                alpha=0.10,
                linewidth=0,
                gid=f"band:{name}:{phase.phase}",
            )
            ax.hlines(
                [bounds.floor, bounds.cap],
                first,
                last,
                colors=colours[name],
                linewidth=0.8,
                linestyles=(0, (3, 2)),
                gid=f"bounds:{name}:{phase.phase}",
            )


def _draw_shares(ax: Axes, view: PlotView) -> None:
    c = view.curve
    colours = view.colours()
    x = c.step.astype(np.float64)
    phases = _phase_rows(c.phase)
    for name in view.arms:
        # One line per arm, broken between phases: each phase's count starts from zero.
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        for rows in phases:
            px, py = _stride(x[rows], view.shares[name][rows])
            xs += [px, np.array([np.nan])]
            ys += [py, np.array([np.nan])]
        ax.plot(
            np.concatenate(xs[:-1]),
            np.concatenate(ys[:-1]),
            color=colours[name],
            linewidth=1.1,
            label=name,
            gid=f"share:{name}",
        )
    _draw_bounds(ax, view, colours)
    ax.set_ylim(0, 1)
    ax.set_ylabel("arm share\n(of the phase so far)")
    _arm_legend(ax, view, "share of the phase's steps so far; bands: the phase's floor and cap")


def _draw_heldout(ax: Axes, view: PlotView) -> None:
    names = sorted({n for e in view.evals for n in e.arms} | set(view.arms))
    colours = view.colours()
    steps = np.array([e.step for e in view.evals], dtype=np.float64)
    for name in names:
        if not any(name in e.arms for e in view.evals):
            continue
        y = np.array([e.arms[name].loss if name in e.arms else np.nan for e in view.evals])
        ax.plot(
            steps,
            y,
            color=colours.get(name, "0.3"),
            linewidth=1.1,
            marker="o",
            markersize=2.5,
            label=name,
            gid=f"heldout:{name}",
        )
    mean = np.array([e.mean_loss() for e in view.evals])
    ax.plot(
        steps, mean, color="black", linewidth=1.2, linestyle="--", label="mean", gid="heldout:mean"
    )
    ax.set_ylabel("held-out loss\n(nats/token)")
    ax.legend(**LEGEND_OUTSIDE)


def _draw_lr(ax: Axes, view: PlotView) -> None:
    x, y = reduce_minmax(view.curve.step.astype(np.float64), view.curve.lr)
    ax.plot(x, y, color="tab:brown", linewidth=1.0, gid="lr")
    ax.set_ylabel("learning rate")
    # Each tick its own value (3e-04), not an offset label that would sit on the panel above.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:.2g}"))


PANELS: tuple[Panel, ...] = (
    Panel("loss", 3.0, lambda v: True, _draw_loss),
    Panel("arm loss", 1.6, lambda v: len(v.arms) > 1, _draw_arm_loss),
    Panel("arm share", 1.6, lambda v: len(v.arms) > 1, _draw_shares),
    Panel("held-out loss", 1.6, lambda v: len(v.evals) > 0, _draw_heldout),
    Panel("learning rate", 1.0, lambda v: True, _draw_lr),
)


def _in_range(curve: LossCurve, since: int | None, until: int | None) -> np.ndarray:
    keep = np.ones(len(curve), dtype=bool)
    if since is not None:
        keep &= curve.step >= since
    if until is not None:
        keep &= curve.step <= until
    return keep


def select_steps(curve: LossCurve, since: int | None, until: int | None) -> LossCurve:
    """The rows of ``curve`` with ``since <= step <= until`` (either bound optional)."""
    keep = _in_range(curve, since, until)
    if keep.all():
        return curve
    fields = {
        name: getattr(curve, name)[keep]
        for name in LossCurve.__dataclass_fields__
        if name != "entries_read"
    }
    return LossCurve(**fields, entries_read=curve.entries_read)


def _view(
    curve: LossCurve,
    events: RunEvents,
    since: int | None,
    until: int | None,
    evals: Sequence[EvalEntry],
) -> PlotView:
    """What the panels draw between ``since`` and ``until``; ValueError when no step lies there."""
    ema_all = loss_ema(curve.loss)
    shown = select_steps(curve, since, until)
    if not len(shown):
        raise ValueError(f"no logged step between {since or 1} and {until or 'the end'}")
    keep = slice(None) if shown is curve else _in_range(curve, since, until)
    lo, hi = int(shown.step[0]), int(shown.step[-1])
    arms = _arm_names(shown, events)
    shares = phase_share(curve.arm, curve.phase, arms)
    return PlotView(
        shown,
        events,
        ema_all[keep],
        (lo, hi),
        arms,
        arm_loss_ema(curve.loss, curve.arm)[keep],
        {n: v[keep] for n, v in shares.items()},
        [e for e in evals if lo <= e.step <= hi],
    )


def _step_axis(bottom: Axes, view: PlotView) -> None:
    """The shared step axis, labelled under the bottom panel."""
    lo, hi = view.x_range
    bottom.set_xlim(lo - 0.5, hi + 0.5 if hi > lo else lo + 0.5)
    bottom.xaxis.set_major_locator(MaxNLocator(nbins=10, steps=ROUND_STEPS, integer=True))
    bottom.xaxis.set_major_formatter(FuncFormatter(_step_label))
    bottom.set_xlabel("step (optimizer update)")


def _summary(view: PlotView) -> str:
    lo, hi = view.x_range
    final = view.ema[np.isfinite(view.ema)]
    return (
        f"steps {lo:,}–{hi:,} ({len(view.curve):,} logged), {len(view.events.restarts)} restart(s), "
        f"{len(view.events.pivots)} pivot(s)"
        + (f", loss EMA {final[-1]:.4f}" if len(final) else "")
    )


def audit_figure(
    curve: LossCurve,
    events: RunEvents,
    title: str = "",
    since: int | None = None,
    until: int | None = None,
    evals: Sequence[EvalEntry] = (),
) -> Figure:
    """The audit figure of ``curve`` (the canonical curve of a run) between ``since`` and ``until``,
    with the held-out panel when ``evals`` (canonical, as from ``canonical_evals``) has entries.

    The EMA is computed over the whole curve before the range is cut, so a zoom shows the same EMA
    values as the full plot. Raises ValueError when no step lies in the range.
    """
    view = _view(curve, events, since, until, evals)
    panels = [p for p in PANELS if p.shown(view)]
    height = 1.4 + 1.3 * sum(p.height for p in panels)
    # Fixed margins rather than constrained layout: the layout pass measures every text twice and
    # took a third of the render at 200,000 steps; the labels here have known sizes.
    fig = Figure(figsize=(12, height))
    fig.subplots_adjust(
        left=0.075, right=LEGEND_MARGIN, bottom=0.75 / height, top=1 - 0.75 / height, hspace=0.1
    )
    axes = fig.subplots(
        len(panels),
        1,
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [p.height for p in panels]},
    )[:, 0]
    for i, (ax, panel) in enumerate(zip(axes, panels)):
        ax.set_gid(f"panel:{panel.name}")
        panel.draw(ax, view)
        _draw_marks(ax, view, labels=i == 0)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=ROUND_STEPS))
        ax.grid(True, linewidth=0.3, alpha=0.5)
    _step_axis(axes[-1], view)
    summary = _summary(view)
    fig.suptitle(f"{title}\n{summary}" if title else summary, fontsize=10)
    return fig


#: Pixels per inch of a PNG (the figure is 12 inches wide).
DPI = 110


def save_figure(fig: Figure, out: Path, dpi: int = DPI) -> None:
    """Write ``fig`` in the format named by ``out``'s extension (one of :data:`FORMATS`)."""
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"{out}: unknown plot format {out.suffix!r}; use .png, .svg or .pdf")
    fig.savefig(out, format=fmt, dpi=dpi)
