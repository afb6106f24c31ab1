"""`andreactl plan` against a real CPU run: the MFU measured on a CPU is never carried to a GPU,
and the run's own data is counted (tests/unit/test_plan_inputs.py has the refusals and floors)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from andrea.control import andreactl
from andrea.control.reports import report_adapter
from andrea.daemon.rundir.layout import RUN_DIR_ENV
from tests.support import forkserver
from tests.support.daemons import trainer_cmd

TOKENS_ARM = '[[data.arms]]\nname = "pre"\nkind = "tokens"\npath = "pre.u16"\ndtype = "uint16"\n'


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = andreactl.main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_cpu_runs_mfu_is_not_carried_to_a_gpu_and_its_data_is_counted(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    ids = 40_000
    np.arange(ids, dtype="<u2").__mod__(256).astype("<u2").tofile(run / "pre.u16")
    (run / "run.toml").write_text(TOKENS_ARM)
    res = forkserver.run(
        trainer_cmd(run, cache_dir, "--device", "cpu", "--max-steps", "6", "--checkpoint-every",
                    "6", "--mixing", "fixed"),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    code, out, err = plan(
        capsys, "--run-dir", str(run), "--gpu", "h100", "--steps", "5000", "--json"
    )
    assert code == 0, err
    p = report_adapter("plan").validate_json(out)
    assert p.speed.mfu == 0.30
    assert (
        "trained on cpu" in p.speed.mfu_source and "a CPU's MFU says nothing" in p.speed.mfu_source
    )
    manifest = json.loads((run / "step_000006.json").read_text())
    counted = sum(c["n_tokens"] for c in manifest["data"])
    assert p.data is not None and "counted" in p.data.how
    assert p.data.training_tokens == counted and 0.8 * ids <= counted <= ids
    assert p.data.passes == pytest.approx(5000 * p.batch.tokens_per_step / counted)
    assert any("passes over the run's" in w for w in p.warnings)
    # $ANDREA_RUN_DIR stands in for --run-dir.
    monkeypatch.setenv(RUN_DIR_ENV, str(run))
    code, again, err = plan(capsys, "--gpu", "h100", "--steps", "5000", "--json")
    assert code == 0, err
    # The config the run trains under, which its first start recorded beside run.toml.
    assert json.loads(again)["source"] == p.source == str(run / ".run.resolved.toml")
    assert json.loads(again)["data"] == json.loads(out)["data"]
