"""Per-arm training loss where people look: the CSV/JSON Lines column, the TensorBoard tags of the
export and of the proxy's live board (with the bandit's rewards), all computed from `.loss.json`;
and the held-out losses of `.eval.json` in the TensorBoard export."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from andrea.control import andreactl
from andrea.daemon.metrics.files import rows
from andrea.daemon.metrics.series import EMA_WEIGHT, arm_loss_ema
from andrea.daemon.metrics.tensorboard import (
    EVAL_ARM_TAG,
    EVAL_MEAN_TAG,
    LiveBoard,
    export_tensorboard,
)
from andrea.daemon.rundir.evallog import EvalLog, canonical_evals, read_evals
from andrea.daemon.rundir.losslog import LossLog, read_curve
from andrea.protocol.evalentry import ArmEval, EvalEntry
from andrea.protocol.lossentry import LossEntry

ARMS = ["code", "random", "code", "code", "random", "docs", "code"]
LOSSES = [3.0, 5.6, 2.8, math.nan, 5.7, 3.3, 2.5]


def per_arm_ema(arms: list[str], losses: list[float]) -> list[float]:
    """By hand: each row's arm's EMA over that arm's finite losses so far."""
    ema: dict[str, float] = {}
    out = []
    for arm, x in zip(arms, losses):
        if math.isfinite(x):
            ema[arm] = x if arm not in ema else (1 - EMA_WEIGHT) * ema[arm] + EMA_WEIGHT * x
        out.append(ema.get(arm, math.nan))
    return out


def entry(step: int, arm: str, loss: float, segment: int = 1) -> LossEntry:
    return LossEntry(
        step=step, loss=loss, arm=arm, lr=1e-3, tokens=64, wall_time=1000.0 + 10 * segment + step,
        segment=segment, phase=0, batch_sha256=None,
    )  # fmt: skip


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_arm_loss_ema_follows_each_arm_alone() -> None:
    got = arm_loss_ema(np.array(LOSSES), np.array(ARMS, dtype=object))
    np.testing.assert_allclose(got, per_arm_ema(ARMS, LOSSES), rtol=1e-15)
    assert math.isnan(arm_loss_ema(np.array([math.nan]), np.array(["a"], dtype=object))[0])


def test_csv_rows_and_tensorboard_export_carry_the_per_arm_loss(tmp_path: Path) -> None:
    log = LossLog.open(tmp_path / ".loss.json")
    log.append_many([entry(s, a, x) for s, (a, x) in enumerate(zip(ARMS, LOSSES), 1)])
    log.close()
    curve = read_curve(tmp_path / ".loss.json")
    expected = per_arm_ema(ARMS, LOSSES)
    for row, want in zip(rows(curve), expected):
        assert row["arm_loss_ema"] == (None if math.isnan(want) else pytest.approx(want))

    export_tensorboard(curve, tmp_path / "tb")
    tb = scalars(tmp_path / "tb")
    for arm in set(ARMS):
        steps = [s for s, a in enumerate(ARMS, 1) if a == arm]
        # A non-finite loss leaves the EMA as it was: the arm's EMA is drawn at each of its steps.
        assert [s for s, _ in tb[f"loss/arm_ema/{arm}"]] == steps
        assert [v for _, v in tb[f"loss/arm_ema/{arm}"]] == pytest.approx(
            [expected[s - 1] for s in steps]
        )
        assert [s for s, _ in tb[f"loss/arm/{arm}"]] == steps


def test_live_board_per_arm_loss_and_rewards_across_a_restart(tmp_path: Path) -> None:
    board = LiveBoard(tmp_path, [])
    first = [entry(s, ARMS[s - 1], 4.0 - s / 10) for s in range(1, 7)]
    board.log(first, {"code": 0.7, "random": 0.1, "docs": 0.2}, {"code": 0.8, "random": 0.0})
    # The trainer restarts from step 3: steps 4.. are trained again, with other losses.
    second = [entry(s, ARMS[s - 1], 3.0 - s / 20, segment=2) for s in range(4, 8)]
    board.log(second, {"code": 0.6}, {"code": 0.9, "random": 0.05})
    board.close()
    canonical = first[:3] + second
    tb = scalars(tmp_path)
    arms = [e.arm for e in canonical]
    losses = [e.loss for e in canonical]
    expected = per_arm_ema(arms, losses)
    for arm in set(arms):
        want = [(e.step, pytest.approx(x)) for e, x in zip(canonical, expected) if e.arm == arm]
        assert tb[f"loss/arm_ema/{arm}"] == want
        assert tb[f"loss/arm/{arm}"] == [
            (e.step, pytest.approx(e.loss)) for e in canonical if e.arm == arm
        ]
    # The rewards go with the last entry of each report; step 6's was superseded by the restart.
    assert tb["mixing/reward/code"] == [(7, pytest.approx(0.9))]
    assert tb["mixing/reward/random"] == [(7, pytest.approx(0.05))]


def evaluation(step: int, losses: dict[str, float], segment: int = 1) -> EvalEntry:
    arms = {a: ArmEval(loss=x, sequences=4, tokens=256) for a, x in losses.items()}
    return EvalEntry(step=step, segment=segment, phase=0, arms=arms, seconds=0.5,
                     wall_time=2000.0 + step)  # fmt: skip


def test_tensorboard_export_carries_the_held_out_losses(tmp_path: Path) -> None:
    log = LossLog.open(tmp_path / ".loss.json")
    log.append_many([entry(s, a, x) for s, (a, x) in enumerate(zip(ARMS, LOSSES), 1)])
    log.close()
    with EvalLog.open(tmp_path / ".eval.json") as evals:
        evals.append(evaluation(3, {"code": 2.9, "docs": 3.4, "random": 5.6}))
        evals.append(evaluation(6, {"code": 9.9, "docs": 9.9, "random": 9.9}))
        # Step 6 evaluated again by a later trainer life: the canonical entry is this one.
        evals.append(evaluation(6, {"code": 2.7, "docs": 3.1, "random": 5.5}, segment=2))
    canonical = canonical_evals(read_evals(tmp_path / ".eval.json"))
    export_tensorboard(read_curve(tmp_path / ".loss.json"), tmp_path / "tb", evals=canonical)
    tb = scalars(tmp_path / "tb")
    assert tb[EVAL_ARM_TAG.format(arm="code")] == [(3, pytest.approx(2.9)), (6, pytest.approx(2.7))]
    assert tb[EVAL_ARM_TAG.format(arm="random")] == [
        (3, pytest.approx(5.6)),
        (6, pytest.approx(5.5)),
    ]
    assert tb[EVAL_MEAN_TAG] == [(3, pytest.approx(11.9 / 3)), (6, pytest.approx(11.3 / 3))]
    # Written with the step's loss, which stays as it was.
    assert [s for s, _ in tb["loss/train"]] == list(range(1, len(ARMS) + 1))


def test_an_evaluation_of_a_step_without_a_loss_is_its_own_event(tmp_path: Path) -> None:
    log = LossLog.open(tmp_path / ".loss.json")
    log.append_many([entry(s, "code", 3.0) for s in (1, 2, 4)])
    log.close()
    evals = [evaluation(s, {"code": 2.0 + s / 10}) for s in (2, 3, 5)]
    export_tensorboard(read_curve(tmp_path / ".loss.json"), tmp_path / "tb", evals=evals)
    tb = scalars(tmp_path / "tb")
    assert [s for s, _ in tb[EVAL_MEAN_TAG]] == [2, 3, 5]
    assert [s for s, _ in tb["loss/train"]] == [1, 2, 4]


def test_metrics_export_command_reads_the_runs_evaluations(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    log = LossLog.open(run / ".loss.json")
    log.append_many([entry(s, a, x) for s, (a, x) in enumerate(zip(ARMS, LOSSES), 1)])
    log.close()
    argv = ["--run-dir", str(run), "--json", "metrics", "export", "--format", "tensorboard"]
    # No .eval.json (a run without a held-out split): the export has no eval tags.
    assert andreactl.main([*argv, "--out", str(tmp_path / "none")]) == 0
    assert json.loads(capsys.readouterr().out)["evaluations"] == 0
    assert not [t for t in scalars(tmp_path / "none") if t.startswith("eval/")]
    with EvalLog.open(run / ".eval.json") as evals:
        for s in (2, 4, 6):
            evals.append(evaluation(s, {"code": 3.0 - s / 10, "docs": 3.5}))
    assert andreactl.main([*argv, "--out", str(tmp_path / "tb")]) == 0
    assert json.loads(capsys.readouterr().out)["evaluations"] == 3
    tb = scalars(tmp_path / "tb")
    assert tb[EVAL_MEAN_TAG] == [(s, pytest.approx((6.5 - s / 10) / 2)) for s in (2, 4, 6)]


def test_live_board_writes_each_evaluation_and_a_restart_drops_the_superseded(
    tmp_path: Path,
) -> None:
    board = LiveBoard(tmp_path, [])
    board.log([entry(s, ARMS[s - 1], 4.0 - s / 10) for s in range(1, 7)], {"code": 1.0})
    board.log_eval(evaluation(3, {"code": 2.9, "docs": 3.4}))
    board.log_eval(evaluation(6, {"code": 9.9, "docs": 9.9}))
    # The trainer restarts from step 4's checkpoint: step 6 is trained and evaluated again.
    board.log([entry(s, ARMS[s - 1], 3.0, segment=2) for s in range(5, 7)], {"code": 1.0})
    board.log_eval(evaluation(6, {"code": 2.7, "docs": 3.1}, segment=2))
    board.close()
    tb = scalars(tmp_path)
    assert tb["eval/arm/code"] == [(3, pytest.approx(2.9)), (6, pytest.approx(2.7))]
    assert tb["eval/arm/docs"] == [(3, pytest.approx(3.4)), (6, pytest.approx(3.1))]
    assert tb["eval/mean"] == [(3, pytest.approx(3.15)), (6, pytest.approx(2.9))]
