"""The mini resume proof (the seed's exercise), end to end with real processes."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from andrea.control import mini_problem as mini
from andrea.control.verify_resume import main
from andrea.control.verify_resume.engine import EXIT_INCOMPLETE, EXIT_MISMATCH, EXIT_OK, REPORT_NAME
from andrea.control.verify_resume.mini import run_mini

ATOL = 1e-12


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-B", *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """One real verification through the command-line entry point: four fresh training processes."""
    output = tmp_path_factory.mktemp("proof") / "mini"
    returncode = main(["--output", str(output), "--problem", "mini"])
    report = json.loads((output / REPORT_NAME).read_text())
    return returncode, report, output


def _comparison(report: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    return next(c for c in report[section] if c["name"] == name)


def test_full_resume_matches_and_negative_diverges(
    verified: tuple[int, dict[str, Any], Path],
) -> None:
    returncode, report, _ = verified
    assert returncode == EXIT_OK, report.get("error")
    assert report["completed"] and report["all_checks_passed"]
    assert report["positive"] is True
    assert report["negative_divergence_detected"] is True
    assert report["tolerance"] == {"absolute": ATOL, "relative": 0.0}
    assert all(c["passed"] for c in report["stop_path"] + report["full_resume"] + report["checks"])

    full, negative = report["figures"]["full_resume"], report["figures"]["no_rng_resume"]
    assert full["max_weight_diff_vs_continuous"] == 0.0
    assert full["eval_mse_diff_vs_continuous"] == 0.0
    assert negative["max_weight_diff_vs_continuous"] > 1e-6
    assert negative["eval_mse_diff_vs_continuous"] > 0.0
    # StepLR(3, 0.5) from 0.03: after 10 updates the next lr is 0.03 * 0.5**3 on both paths.
    assert (
        full["next_lr"]
        == negative["next_lr"]
        == report["figures"]["continuous"]["next_lr"]
        == 0.00375
    )

    # The negative case keeps weights-only bookkeeping right, and still diverges where the RNGs matter.
    for same in (
        "scheduler state",
        "learning rates (steps 6-10)",
        "step numbers and epochs (steps 6-10)",
    ):
        assert _comparison(report, "no_rng_resume", same)["passed"]
    for drifted in (
        "row ids consumed (steps 6-10)",
        "final parameters",
        "next draws: NumPy PCG64",
        "next draws: torch CPU",
    ):
        assert _comparison(report, "no_rng_resume", drifted)["diverged"]


def test_the_stop_is_mid_epoch_and_the_resume_crosses_a_new_order(
    verified: tuple[int, dict[str, Any], Path],
) -> None:
    _, _, output = verified
    stop = json.loads((output / "stop" / mini.SUMMARY_NAME).read_text())
    continuous = json.loads((output / "continuous" / mini.SUMMARY_NAME).read_text())
    assert (stop["progress"]["step"], stop["progress"]["epoch"], stop["progress"]["cursor"]) == (
        5,
        0,
        20,
    )
    assert [r["epoch"] for r in continuous["history"]] == [0] * 6 + [1] * 4
    assert sum(p.numel() for p in mini.build_model(mini.MiniConfig()).parameters()) == 33


@pytest.mark.parametrize("sabotage", mini.SABOTAGES)
def test_every_sabotage_fails_the_verification(
    verified: tuple[int, dict[str, Any], Path], tmp_path: Path, sabotage: str
) -> None:
    # The reference paths come from the verified run; the sabotaged resume runs fresh.
    expected_failures = {
        mini.SCHEDULER_AFTER_OPTIMIZER: {
            "learning rates (steps 6-10)",
            "next lr after step 10",
            "scheduler state",
        },
        mini.SKIP_DATA_CURSOR: {
            "row ids consumed (steps 6-10)",
            "progress (step, epoch, cursor, order)",
        },
        mini.SKIP_OPTIMIZER_STATE: {"optimizer state", "final parameters"},
        mini.SKIP_NUMPY_RNG: {"next draws: NumPy PCG64", "random gains and noise (steps 6-10)"},
    }[sabotage]
    output = tmp_path / "sabotaged"

    assert run_mini(output, sabotage=sabotage, reuse=verified[2]) == EXIT_MISMATCH

    report = json.loads((output / REPORT_NAME).read_text())
    assert report["completed"] and not report["all_checks_passed"] and not report["positive"]
    failed = {c["name"] for c in report["full_resume"] if not c["passed"]}
    assert expected_failures <= failed
    if sabotage == mini.SKIP_NUMPY_RNG:
        # Only the generator left out drifts: the two that were restored still match.
        assert {"next draws: Python random", "next draws: torch CPU"}.isdisjoint(failed)


def test_a_corrupted_checkpoint_is_refused(
    verified: tuple[int, dict[str, Any], Path], tmp_path: Path
) -> None:
    for name in (mini.CHECKPOINT_NAME, mini.CHECKPOINT_NAME + ".sha256"):
        shutil.copy(verified[2] / "stop" / name, tmp_path / name)
    checkpoint = tmp_path / mini.CHECKPOINT_NAME
    data = bytearray(checkpoint.read_bytes())
    data[len(data) // 2] ^= 0xFF
    checkpoint.write_bytes(bytes(data))
    output = tmp_path / "resumed"

    done = _python(
        "-m",
        "andrea.control.mini_problem",
        "train",
        "--steps",
        "5",
        "--resume",
        str(checkpoint),
        "--output",
        str(output),
    )

    assert done.returncode == 2, done.stderr
    assert "sha256" in done.stderr and "does not match its fingerprint" in done.stderr
    assert not output.exists()


def test_an_existing_output_directory_is_refused(
    verified: tuple[int, dict[str, Any], Path], tmp_path: Path
) -> None:
    evidence = tmp_path / "evidence.txt"
    evidence.write_text("earlier run")

    # In-process is enough here: the refusal comes before anything touches torch's global settings.
    with pytest.raises(mini.Refused, match="already exists"):
        mini.train(1, tmp_path)
    assert run_mini(tmp_path) == EXIT_INCOMPLETE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence.txt"]
    assert evidence.read_text() == "earlier run"

    # Reuse takes only a passed, unsabotaged verification as its reference.
    failed_report = json.loads((verified[2] / REPORT_NAME).read_text()) | {
        "all_checks_passed": False
    }
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / REPORT_NAME).write_text(json.dumps(failed_report))
    assert (
        run_mini(tmp_path / "again", sabotage=mini.SKIP_NUMPY_RNG, reuse=tmp_path / "failed")
        == EXIT_INCOMPLETE
    )


def _refingerprint(path: Path, payload: dict[str, Any]) -> None:
    torch.save(payload, path)
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    path.with_name(path.name + ".sha256").write_text(
        f"# tampered, {len(data)} bytes\n{digest}  {path.name}\n"
    )


def _tamper_progress(c: dict[str, Any]) -> None:
    c["progress"]["cursor"] = 16


def _tamper_weights(c: dict[str, Any]) -> None:
    c["model"]["0.weight"] += 1e-3


def _tamper_adam_step(c: dict[str, Any]) -> None:
    c["optimizer"]["state"][0]["step"] += 1


def _tamper_rng_keys(c: dict[str, Any]) -> None:
    del c["rng"]["numpy"]


def _tamper_code(c: dict[str, Any]) -> None:
    c["code_version"] = "0" * 64


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (_tamper_progress, "progress inconsistent"),
        (_tamper_weights, "model weights are not the weights recorded"),
        (_tamper_adam_step, "optimizer state 0 counts"),
        (_tamper_rng_keys, "rng must hold exactly"),
        (_tamper_code, "another version of the andrea.control.mini_problem package"),
    ],
)
def test_an_inconsistent_checkpoint_is_refused_even_with_a_valid_fingerprint(
    verified: tuple[int, dict[str, Any], Path], tmp_path: Path, tamper: Any, message: str
) -> None:
    source = verified[2] / "stop" / mini.CHECKPOINT_NAME
    identity = mini.current_identity(mini.MiniConfig())
    assert mini.load_checkpoint(source, identity).progress.step == 5
    payload = torch.load(source, map_location="cpu", weights_only=True)
    tamper(payload)
    target = tmp_path / mini.CHECKPOINT_NAME
    _refingerprint(target, payload)

    with pytest.raises(mini.CheckpointError, match=message):
        mini.load_checkpoint(target, identity)
