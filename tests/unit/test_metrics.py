"""Metrics where people look: TensorBoard event files (live from the proxy, and rebuilt by `andreactl
metrics export`) read back with TensorBoard's own reader, CSV/JSON Lines exports, and the Prometheus
exposition parsed with prometheus-client's parser. Expected values come from the raw .loss.json."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from andrea.daemon.config import MetricsConfig
from andrea.daemon.metrics.prometheus import (
    beyond_localhost,
    exposition_for,
)
from andrea.daemon.metrics.tensorboard import LiveBoard
from andrea.protocol.lossentry import LossEntry
from tests.support.metrics_reading import ema_of, scalars


def test_prometheus_textfile_parses(tmp_path: Path) -> None:
    ex = exposition_for(MetricsConfig(prometheus_textfile_dir="prom"), "proxy", tmp_path / "r1")
    assert ex is not None
    ex.set({"andrea_phase": 2, "andrea_logged_step": 1200, "andrea_zombie_arms": 1})
    ex.set_arm_probabilities({"code": 0.25, "docs": 0.75})
    ex.publish(force=True)
    text = (tmp_path / "r1" / "prom" / "andrea-proxy-r1.prom").read_text()
    got = {
        (s.name, s.labels.get("arm")): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert got == {
        ("andrea_phase", None): 2,
        ("andrea_logged_step", None): 1200,
        ("andrea_zombie_arms", None): 1,
        ("andrea_arm_probability", "code"): 0.25,
        ("andrea_arm_probability", "docs"): 0.75,
    }
    assert exposition_for(MetricsConfig(), "trainer", tmp_path) is None


@pytest.mark.parametrize(
    ("address", "beyond"),
    [("127.0.0.1", False), ("::1", False), ("localhost", False), ("127.0.0.53", False),
     ("0.0.0.0", True), ("::", True), ("10.1.2.3", True), ("metrics.example.org", True)],
)  # fmt: skip
def test_which_addresses_reach_beyond_this_host(address: str, beyond: bool) -> None:
    assert (beyond_localhost(address) is not None) == beyond


def entry(step: int, segment: int, loss: float) -> LossEntry:
    return LossEntry(
        step=step, loss=loss, arm="code", lr=1e-3, tokens=100, wall_time=1000.0 + segment * 100 + step,
        segment=segment, phase=0, batch_sha256=None,
    )  # fmt: skip


def test_live_board_follows_the_canonical_curve_across_a_restart(tmp_path: Path) -> None:
    board = LiveBoard(tmp_path, [])
    first = [entry(s, 1, 5.0 - s / 10) for s in range(1, 11)]
    board.log(first[:6], {"code": 1.0})
    board.log(first[4:], {"code": 1.0})  # a re-sent batch is written once
    second = [entry(s, 2, 4.0 - s / 20) for s in range(6, 13)]  # restart from step 5's checkpoint
    board.log(second, {"code": 1.0})
    board.close()
    canonical = first[:5] + second
    tb = scalars(tmp_path)
    assert tb["loss/train"] == [(e.step, pytest.approx(e.loss)) for e in canonical]
    assert [v for _, v in tb["loss/ema"]] == pytest.approx(ema_of([e.loss for e in canonical]))
