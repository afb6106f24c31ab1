"""Held-out evaluation and gradient accumulation with real trainer processes and real signals.

Evaluation must change no bit of training (weights, m, v, every loss), keep resume bit-exact,
and give way to a stop at once; gradient accumulation must keep resume bit-exact too.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 20
ARGS = ("--max-steps", str(STEPS), "--checkpoint-every", "10", "--grad-accum", "2")


def evals(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / ".eval.json").read_text())


def losses(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in json.loads((run_dir / ".loss.json").read_text())}


def carried(run_dir: Path) -> dict[int, dict[str, float]]:
    """The held-out losses each step's record carries (the newest record of a step wins)."""
    entries = json.loads((run_dir / ".loss.json").read_text())
    return {e["step"]: e["heldout"] for e in entries if "heldout" in e}


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The never-stopped reference: two micro-batches per step, evaluated every 5 steps."""
    run_dir = tmp_path_factory.mktemp("evaluated")
    res = run_trainer(run_dir, cache_dir, *ARGS, "--eval-every", "5")
    assert res.returncode == 0, res.stderr
    return run_dir


def test_evaluation_changes_no_bit_of_training(
    evaluated: Path, tmp_path: Path, cache_dir: Path
) -> None:
    res = run_trainer(tmp_path, cache_dir, *ARGS, "--eval-every", "0")
    assert res.returncode == 0, res.stderr
    assert evals(tmp_path) == []
    got = evals(evaluated)
    assert [e["step"] for e in got] == [5, 10, 15, 20]
    assert all(set(e["arms"]) == {"docstrings", "code", "comments"} for e in got)
    assert all(a["sequences"] == 64 for e in got for a in e["arms"].values())
    # Held-out loss falls as training proceeds (a tiny model learns bytes fast).
    assert got[-1]["arms"]["code"]["loss"] < got[0]["arms"]["code"]["loss"]
    assert losses(tmp_path) == losses(evaluated)
    for step in (10, STEPS):
        assert (tmp_path / bin_name(step)).read_bytes() == (evaluated / bin_name(step)).read_bytes()
    # Each step trained batch_size sequences of block_size tokens, in grad_accum micro-batches.
    entries = json.loads((evaluated / ".loss.json").read_text())
    assert {e["tokens"] for e in entries} == {8 * 64}
    man = json.loads((evaluated / manifest_name(STEPS)).read_text())
    assert man["last_eval_step"] == STEPS and man["environment"]["compiled"] is False
    assert man["config"]["grad_accum"] == 2 and man["config"]["data"]["heldout_fraction"] == 0.05


def test_resume_with_evaluation_and_accumulation_is_bit_exact(
    evaluated: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """Three lives of one run, compared with the never-stopped reference: SIGKILL once the
    checkpoint of an evaluated step (10) is written, then SIGTERM past step 11, then to the end.
    The resume from step 10 starts from its weights, whose evaluation only the manifest still
    holds for the record of step 11 (the killed life may or may not have recorded step 11
    already). (One run for both stops: a trainer start is most of this test's cost.)"""
    t = Daemon(trainer_cmd(tmp_path, cache_dir, *ARGS, "--eval-every", "5"))
    t.wait_for(r"checkpoint step_000010.bin written \(cadence")
    t.signal(signal.SIGKILL)
    t.wait()
    raw = (tmp_path / manifest_name(10)).read_text()
    assert json.loads(raw)["heldout"] == carried(evaluated)[11]
    # A diverged arm's held-out loss (NaN) survives the manifest's round trip.
    diverged = Manifest.model_validate_json(raw).model_copy(update={"heldout": {"code": math.nan}})
    again = Manifest.model_validate_json(diverged.model_dump_json())
    assert again.heldout is not None and math.isnan(again.heldout["code"])

    t = Daemon(trainer_cmd(tmp_path, cache_dir, *ARGS, "--eval-every", "5"))
    t.wait_for(rf"step 11/{STEPS} ")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert f"resumed from {bin_name(10)}" in t.log, t.log
    stopped = max(int(p.stem[5:]) for p in tmp_path.glob("step_*.json"))
    assert 10 < stopped < STEPS

    res = run_trainer(tmp_path, cache_dir, *ARGS, "--eval-every", "5")
    assert res.returncode == 0, res.stderr
    assert f"resumed from {bin_name(stopped)}" in res.stderr
    assert carried(tmp_path) == carried(evaluated)
    assert losses(tmp_path) == losses(evaluated)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (evaluated / bin_name(STEPS)).read_bytes()
    # The same weights give the same held-out losses, bit for bit, whichever life evaluated them.
    mine = {e["step"]: e["arms"] for e in evals(tmp_path)}
    assert mine == {e["step"]: e["arms"] for e in evals(evaluated)}


def test_the_record_after_an_evaluation_carries_it(evaluated: Path) -> None:
    """The bandit reads evaluations in the loss records' stream: the record of step s + 1 carries
    the held-out losses of the weights after step s, exactly as .eval.json holds them."""
    scored = {e["step"]: {n: a["loss"] for n, a in e["arms"].items()} for e in evals(evaluated)}
    assert carried(evaluated) == {s + 1: arms for s, arms in scored.items() if s < STEPS}


def test_stop_during_evaluation_is_honoured_at_once(tmp_path: Path, cache_dir: Path) -> None:
    config = tmp_path / "big-eval.toml"
    config.write_text("[eval]\nsequences = 100000\n")  # every held-out chunk: seconds of work
    run_dir = tmp_path / "run"
    t = Daemon(
        trainer_cmd(run_dir, cache_dir, "--config", str(config), "--max-steps", "100")
        + ["--checkpoint-every", "5"]
    )
    t.wait_for(r"evaluating step 5 on held-out data")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    assert "evaluation of step 5 abandoned: stop requested" in t.log
    assert "held-out loss at step 5" not in t.log
    assert max(int(p.stem[5:]) for p in run_dir.glob("step_*.json")) == 5
    man = json.loads((run_dir / manifest_name(5)).read_text())
    assert man["last_eval_step"] == 0
    assert evals(run_dir) == []
    # The resume evaluates the interrupted step before it trains another (with a smaller set:
    # the evaluation settings are operational and may change at a restart).
    run_toml = run_dir / "run.toml"
    assert "sequences = 100000" in run_toml.read_text()
    run_toml.write_text(run_toml.read_text().replace("sequences = 100000", "sequences = 8"))
    res = run_trainer(run_dir, cache_dir, "--max-steps", "6")
    assert res.returncode == 0, res.stderr
    assert res.stderr.index("evaluating step 5") < res.stderr.index("step 6/6")
    assert [(e["step"], e["segment"]) for e in evals(run_dir)] == [(5, 2)]


def test_proxy_records_evaluations(tmp_path: Path, cache_dir: Path) -> None:
    res = run_trainer(
        tmp_path, cache_dir, "--with-proxy", "--max-steps", "10", "--checkpoint-every", "5"
    )
    assert res.returncode == 0, res.stderr
    got = evals(tmp_path)
    assert [(e["step"], e["segment"], e["phase"]) for e in got] == [(5, 1, 0), (10, 1, 0)]
    man = json.loads((tmp_path / manifest_name(10)).read_text())
    assert man["pending_evals"] == [] or man["pending_evals"][0]["step"] == 10
    # The evaluations reach the bandit (gated-heldout reads them): a resume that changes them
    # says so, naming the change.
    res = run_trainer(
        tmp_path, cache_dir, "--with-proxy", "--max-steps", "12", "--checkpoint-every", "5",
        "--eval-every", "3",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "the held-out evaluations changed (evaluation every 5 steps → 3)" in res.stderr
    assert "NOT be bit-exact" not in res.stderr


def test_andreactl_history_lists_evaluations(evaluated: Path) -> None:
    from tests.support.daemons import andreactl as ctl

    res = ctl(evaluated, "--json", "history", "--eval", "--last", "0")
    assert res.returncode == 0, res.stderr
    listed = json.loads(res.stdout)["rows"]
    assert [e["step"] for e in listed] == [5, 10, 15, 20]
    assert listed == evals(evaluated)
    text = ctl(evaluated, "history", "--last", "3")
    assert text.returncode == 0, text.stderr
    last = evals(evaluated)[-1]["arms"]
    assert text.stdout.splitlines()[-1].startswith(
        f"held-out step 20: mean {sum(a['loss'] for a in last.values()) / 3:.4f}, worst "
    )


def test_audit_plot_has_a_held_out_panel_per_arm(evaluated: Path) -> None:
    from andrea.control.plot import audit_figure
    from andrea.control.run_events import read_run_events
    from andrea.daemon.rundir.evallog import canonical_evals, read_evals
    from andrea.daemon.rundir.losslog import read_curve

    curve = read_curve(evaluated / ".loss.json")
    fig = audit_figure(
        curve,
        read_run_events(evaluated, curve),
        evals=canonical_evals(read_evals(evaluated / ".eval.json")),
    )
    axes = {ax.get_gid(): ax for ax in fig.axes if ax.get_gid()}
    assert list(axes) == [
        "panel:loss",
        "panel:arm loss",
        "panel:arm share",
        "panel:held-out loss",
        "panel:learning rate",
    ]
    held = axes["panel:held-out loss"]
    lines = {
        a.get_gid(): a for a in held.get_children() if (a.get_gid() or "").startswith("heldout")
    }
    recorded = evals(evaluated)
    for arm in ("code", "comments", "docstrings"):
        assert list(lines[f"heldout:{arm}"].get_xdata()) == [e["step"] for e in recorded]
        assert list(lines[f"heldout:{arm}"].get_ydata()) == [
            e["arms"][arm]["loss"] for e in recorded
        ]
    means = [sum(a["loss"] for a in e["arms"].values()) / 3 for e in recorded]
    np.testing.assert_allclose(lines["heldout:mean"].get_ydata(), means, rtol=1e-12)
