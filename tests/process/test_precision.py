"""The `precision` setting: bf16 autocast really changes the arithmetic, resumes bit-exactly within
its own mode, is recorded in the manifest, and a resume under another mode is announced as inexact.

On CPU (all CI has) this covers fp32 and bf16; tf32 and the CUDA branch of `auto` need a GPU.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

STEPS = 24


def curve(run_dir: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in json.loads((run_dir / ".loss.json").read_text())}


def recorded_dtype(run_dir: Path, step: int) -> str:
    return json.loads((run_dir / manifest_name(step)).read_text())["environment"]["dtype"]


@pytest.fixture(scope="module")
def bf16_reference(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("bf16")
    res = run_trainer(
        run_dir,
        cache_dir,
        "--max-steps",
        str(STEPS),
        "--checkpoint-every",
        "10",
        "--precision",
        "bf16",
    )
    assert res.returncode == 0, res.stderr
    return run_dir


def test_bf16_sigterm_then_restart_is_bit_exact(
    tmp_path: Path, cache_dir: Path, bf16_reference: Path
) -> None:
    args = ("--max-steps", str(STEPS), "--checkpoint-every", "10", "--precision", "bf16")
    t = Daemon(trainer_cmd(tmp_path, cache_dir, *args))
    t.wait_for(rf"step 13/{STEPS} ")
    t.signal(signal.SIGTERM)
    assert t.wait() == ExitCode.OK, t.log
    res = run_trainer(tmp_path, cache_dir, *args)
    assert res.returncode == 0, res.stderr
    assert "NOT be bit-exact" not in res.stderr
    assert curve(tmp_path) == curve(bf16_reference)
    assert (tmp_path / bin_name(STEPS)).read_bytes() == (
        bf16_reference / bin_name(STEPS)
    ).read_bytes()


def test_bf16_changes_the_arithmetic_and_a_switch_is_announced(
    tmp_path: Path, cache_dir: Path, bf16_reference: Path
) -> None:
    res = run_trainer(tmp_path, cache_dir, "--max-steps", "4", "--checkpoint-every", "0")
    assert res.returncode == 0, res.stderr
    assert "parameters on cpu, float32, 1 threads" in res.stderr
    fp32, bf16 = curve(tmp_path), curve(bf16_reference)
    # Same batches and initial weights; only the arithmetic differs, from the very first loss on ...
    assert all(fp32[s] != bf16[s] for s in (1, 2, 3, 4)), (fp32, bf16)
    assert abs(fp32[1] - bf16[1]) < 0.05  # ... and only in the low bits
    assert recorded_dtype(tmp_path, 4) == "float32"
    assert recorded_dtype(bf16_reference, STEPS) == "bfloat16-autocast"

    res = run_trainer(
        tmp_path, cache_dir, "--max-steps", "6", "--checkpoint-every", "0", "--precision", "bf16"
    )
    assert res.returncode == 0, res.stderr
    assert (
        "will NOT be bit-exact" in res.stderr and "dtype: float32 → bfloat16-autocast" in res.stderr
    ), res.stderr
    assert recorded_dtype(tmp_path, 6) == "bfloat16-autocast"


def test_tf32_on_cpu_is_a_config_error_that_trains_nothing(tmp_path: Path, cache_dir: Path) -> None:
    res = run_trainer(
        tmp_path, cache_dir, "--max-steps", "4", "--device", "cpu", "--precision", "tf32"
    )
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "precision 'tf32' needs a CUDA device" in res.stderr
    assert not list(tmp_path.glob("step_*")) and not (tmp_path / ".loss.json").exists()
    assert not (tmp_path / "run.toml").exists()  # a config this machine cannot run is not recorded


def test_cuda_device_without_cuda_is_a_config_error(tmp_path: Path, cache_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = run_trainer(tmp_path, cache_dir, "--max-steps", "4", "--device", "cuda")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "device 'cuda' requested but CUDA is not available" in res.stderr
    assert not (tmp_path / "run.toml").exists()
