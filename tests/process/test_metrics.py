"""Metrics of real runs, where people look: the proxy's live TensorBoard files, `andreactl metrics
export`, both daemons' Prometheus textfiles and the HTTP endpoint, read back with TensorBoard's
and prometheus-client's own parsers; expected values come from the raw .loss.json
(tests/unit/test_metrics.py has the in-process parts)."""

from __future__ import annotations

import csv
import json
import logging
import socket
import subprocess
import urllib.request
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from andrea.daemon.metrics.prometheus import (
    Exposition,
    textfile_name,
)
from tests.support.audited_run import canonical_rows
from tests.support.daemons import andreactl
from tests.support.metrics_reading import ema_of, scalars


def assert_matches_loss_json(tb: dict[str, list[tuple[int, float]]], rows: list[dict]) -> None:
    steps = [r["step"] for r in rows]
    for tag, field in (("loss/train", "loss"), ("optim/lr", "lr"), ("mixing/phase", "phase")):
        assert [s for s, _ in tb[tag]] == steps, tag
        # Event files store 32-bit floats.
        np.testing.assert_array_equal(
            [v for _, v in tb[tag]], np.float32([r[field] for r in rows]), err_msg=tag
        )
    assert [v for _, v in tb["run/segment"]] == [r["segment"] for r in rows]
    np.testing.assert_allclose(
        [v for _, v in tb["loss/ema"]], ema_of([r["loss"] for r in rows]), rtol=1e-6
    )
    rates = dict(tb["throughput/tokens_per_second"])
    for prev, row in zip(rows, rows[1:]):
        if prev["segment"] == row["segment"]:
            expected = row["tokens"] / (row["wall_time"] - prev["wall_time"])
            assert rates[row["step"]] == pytest.approx(expected, rel=1e-6)
        else:
            assert row["step"] not in rates, "a restart's downtime is not a throughput"


def ctl(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return andreactl(run_dir, *args, timeout=300)


def test_live_tensorboard_of_the_proxy(audited_run: Path) -> None:
    rows = canonical_rows(audited_run)
    tb = scalars(audited_run / "tensorboard")
    assert_matches_loss_json(tb, rows)
    # The bandit's probabilities: the live arms', summing to 1, within the policy in force.
    live = json.loads((audited_run / ".state.json").read_text())["live_probabilities"]
    prob = {arm: dict(tb[f"mixing/probability/{arm}"]) for arm in live}
    assert set(live) == {"code", "docstrings"} and prob["code"].keys() == prob["docstrings"].keys()
    phase = {r["step"]: r["phase"] for r in rows}
    after_pivot = [s for s in prob["code"] if phase[s] == 1]
    assert after_pivot and after_pivot[-1] == rows[-1]["step"]
    for s in after_pivot:
        assert prob["code"][s] + prob["docstrings"][s] == pytest.approx(1.0, abs=1e-6)
        assert 0.2 - 1e-6 <= prob["code"][s] <= 0.6 + 1e-6 and prob["docstrings"][s] >= 0.3 - 1e-6


def test_metrics_export_tensorboard_csv_jsonl(audited_run: Path, tmp_path: Path) -> None:
    rows = canonical_rows(audited_run)
    res = ctl(audited_run, "--json", "metrics", "export", "--format", "tensorboard", "--out",
              str(tmp_path / "tb"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["steps"] == len(rows)
    tb = scalars(tmp_path / "tb")
    assert_matches_loss_json(tb, rows)
    assert {"mixing/share/code", "mixing/share/comments", "mixing/share/docstrings"} <= set(tb)

    for fmt in ("csv", "jsonl"):
        out = tmp_path / f"curve.{fmt}"
        res = ctl(audited_run, "metrics", "export", "--format", fmt, "--out", str(out))
        assert res.returncode == 0, res.stderr
        with out.open() as f:
            got = list(csv.DictReader(f)) if fmt == "csv" else [json.loads(x) for x in f]
        assert [int(g["step"]) for g in got] == [r["step"] for r in rows]
        assert [float(g["loss"]) for g in got] == [r["loss"] for r in rows]
        assert [g["arm"] for g in got] == [r["arm"] for r in rows]
        assert [int(g["segment"]) for g in got] == [r["segment"] for r in rows]
        assert [float(g["loss_ema"]) for g in got] == pytest.approx(
            ema_of([r["loss"] for r in rows]), rel=1e-12
        )
        for g, r in zip(got, rows):
            utc = datetime.fromisoformat(g["utc"])
            assert utc.utcoffset().total_seconds() == 0
            assert utc.timestamp() == pytest.approx(r["wall_time"], abs=1e-3)

    again = ctl(audited_run, "metrics", "export", "--format", "csv", "--out", str(out))
    assert again.returncode == 2 and "already exists" in again.stderr
    assert "Traceback" not in again.stderr


def test_prometheus_textfiles_of_both_daemons(audited_run: Path) -> None:
    run = audited_run.name
    files = audited_run / "prometheus"
    trainer = {
        s.name: s.value
        for fam in text_string_to_metric_families(
            (files / textfile_name("trainer", run)).read_text()
        )
        for s in fam.samples
        if s.labels["run"] == run
    }
    rows = canonical_rows(audited_run)
    assert trainer["andrea_step"] == rows[-1]["step"] == trainer["andrea_max_steps"]
    assert trainer["andrea_segment"] == rows[-1]["segment"]
    assert trainer["andrea_holding"] == 0 and trainer["andrea_proxy_link_lag_steps"] == 0
    assert trainer["andrea_learning_rate"] == pytest.approx(rows[-1]["lr"])
    assert trainer["andrea_tokens_per_second"] > 0
    assert 0 <= trainer["andrea_checkpoint_age_seconds"] < 600
    proxy_samples = [
        s
        for fam in text_string_to_metric_families((files / textfile_name("proxy", run)).read_text())
        for s in fam.samples
    ]
    proxy = {s.name: s.value for s in proxy_samples if "arm" not in s.labels}
    state = json.loads((audited_run / ".state.json").read_text())
    assert proxy["andrea_phase"] == 1 and proxy["andrea_logged_step"] == rows[-1]["step"]
    assert proxy["andrea_zombie_arms"] == len(state["zombies"])
    probabilities = {
        s.labels["arm"]: s.value for s in proxy_samples if s.name == "andrea_arm_probability"
    }
    assert probabilities == pytest.approx(state["live_probabilities"])


def test_prometheus_http_endpoint_on_localhost() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ex = Exposition("trainer", "r")
    ex.serve("127.0.0.1", port)
    ex.set({"andrea_step": 7, "andrea_loss_ema": 2.5, "andrea_learning_rate": None})
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    got = {s.name: s.value for fam in text_string_to_metric_families(body) for s in fam.samples
           if s.labels.get("run") == "r"}  # fmt: skip
    assert got == {"andrea_step": 7, "andrea_loss_ema": 2.5}


def test_an_endpoint_beyond_localhost_is_announced_with_a_warning(caplog) -> None:
    """Issue 24, item 16: prometheus_address = "0.0.0.0" exposed the run without a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with caplog.at_level(logging.INFO, logger="andrea.daemon.metrics.prometheus"):
        Exposition("trainer", "r").serve("127.0.0.1", port)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        Exposition("trainer", "r").serve("0.0.0.0", port + 1 if port < 65535 else port - 1)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "0.0.0.0" in warning.getMessage() and "every network" in warning.getMessage()
    assert "prometheus_address" in warning.getMessage()
