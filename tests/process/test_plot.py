"""The audit plot, checked on the figure object: every panel and mark on a real run with restarts, a
pivot, a zombie arm and an audit checkpoint; spikes kept at 200,000 steps; round ticks; step ranges."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from andrea.control import andreactl
from andrea.control.plot import audit_figure
from andrea.control.run_events import RunEvents, read_run_events
from andrea.daemon.rundir.losslog import read_curve
from tests.support.audited_run import canonical_rows
from tests.support.plotting import round_ticks, tick_values


def panels(fig: Figure) -> dict[str, Axes]:
    return {ax.get_gid().removeprefix("panel:"): ax for ax in fig.axes if ax.get_gid()}


def by_gid(ax: Axes, gid: str) -> list:
    return [a for a in ax.get_children() if a.get_gid() == gid]


def mark_xs(ax: Axes, kind: str) -> list[float]:
    (coll,) = by_gid(ax, kind)
    return sorted(float(seg[0][0]) for seg in coll.get_segments())


def test_every_panel_and_mark_of_a_real_run(audited_run: Path) -> None:
    rows = canonical_rows(audited_run)
    curve = read_curve(audited_run / ".loss.json")
    events = read_run_events(audited_run, curve)
    fig = audit_figure(curve, events, title="audited run")
    p = panels(fig)
    assert list(p) == ["loss", "arm loss", "arm share", "learning rate"]
    loss, share, lr = p["loss"], p["arm share"], p["learning rate"]
    assert loss.get_shared_x_axes().joined(loss, lr) and loss.get_shared_x_axes().joined(
        loss, share
    )
    for ax in p.values():
        assert ax.get_ylabel()
    assert "step" in lr.get_xlabel()

    # Loss and EMA: every canonical step, and the EMA recomputed here from the raw values.
    (line,) = by_gid(loss, "loss")
    assert list(line.get_xdata()) == [r["step"] for r in rows]
    assert list(line.get_ydata()) == [r["loss"] for r in rows]
    ema, expected = None, []
    for r in rows:
        ema = r["loss"] if ema is None else 0.9 * ema + 0.1 * r["loss"]
        expected.append(ema)
    (ema_line,) = by_gid(loss, "ema")
    np.testing.assert_allclose(ema_line.get_ydata(), expected, rtol=1e-12)

    # Marks, from the run's own files: segment starts, pivot.json, manifests, the zombie's last draw.
    starts = [b["step"] - 0.5 for a, b in zip(rows, rows[1:]) if a["segment"] != b["segment"]]
    assert len(starts) == 2
    (record_path,) = audited_run.glob("archive/pivot-*/pivot.json")
    record = json.loads(record_path.read_text())
    audits = [
        int(m.name[5:11])
        for m in audited_run.glob("step_*.json")
        if json.loads(m.read_text())["trigger"] == "sigusr1"
    ]
    assert audits
    last_comment = max(r["step"] for r in rows if r["arm"] == "comments")
    for ax in p.values():
        assert mark_xs(ax, "restart") == starts
        assert mark_xs(ax, "pivot") == [record["boundary_step"] + 0.5]
        assert mark_xs(ax, "audit") == sorted(audits)
        assert mark_xs(ax, "zombie") == [last_comment + 0.5]
    (label,) = by_gid(loss, "pivot-label:1")
    assert label.get_text() == f"phase 1\n{record['new_policy'][:8]}"
    assert by_gid(loss, "zombie-label:comments")
    legend = [t.get_text() for t in loss.get_legend().get_texts()]
    assert {"loss", "loss EMA", "restart (new segment)", "pivot (phase, policy)"} <= set(legend)
    assert {"audit checkpoint", "zombie arm (last draw)"} <= set(legend)

    # Arm shares, with the new phase's bounds from the policy the pivot put in force.
    for arm in ("code", "comments", "docstrings"):
        assert by_gid(share, f"share:{arm}")
    for arm, floor, cap in (("code", 0.2, 0.6), ("docstrings", 0.3, 1.0)):
        (band,) = by_gid(share, f"band:{arm}:1")
        xs, ys = band.get_paths()[0].vertices.T
        assert (xs.min(), xs.max()) == (record["boundary_step"] + 1, rows[-1]["step"])
        assert (ys.min(), ys.max()) == pytest.approx((floor, cap))
    assert not by_gid(share, "band:code:0"), "phase 0 had no bounds"

    (lr_line,) = by_gid(lr, "lr")
    assert list(lr_line.get_ydata()) == [r["lr"] for r in rows]
    for ax in p.values():
        assert round_ticks(tick_values(ax, "y")), tick_values(ax, "y")
    assert round_ticks(tick_values(lr, "x")), tick_values(lr, "x")


def test_step_range_and_the_command(audited_run: Path, tmp_path: Path, capsys) -> None:
    curve = read_curve(audited_run / ".loss.json")
    fig = audit_figure(curve, read_run_events(audited_run, curve), since=10, until=30)
    (line,) = by_gid(panels(fig)["loss"], "loss")
    assert list(line.get_xdata()) == list(range(10, 31))
    with pytest.raises(ValueError, match="no logged step"):
        audit_figure(curve, RunEvents(), since=10_000)

    # The command as a user runs it (a process), then the SVG path in this process.
    argv = ["plot", "--run-dir", str(audited_run), "--json", "--since", "5", "--out"]
    png, svg = tmp_path / "run.png", tmp_path / "run.svg"
    res = subprocess.run(
        [sys.executable, "-m", "andrea.control.andreactl", *argv, str(png)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    assert andreactl.main([*argv, str(svg)]) == 0
    for out, stdout in ((png, res.stdout), (svg, capsys.readouterr().out)):
        report = json.loads(stdout)
        assert report["steps"] == len(curve) - 4 and report["zombies"] == ["comments"]
        assert out.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in svg.read_bytes()[:2000]
