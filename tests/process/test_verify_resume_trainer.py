"""The real trainer's resume proof: fresh andrea-trainer processes, a real SIGTERM, bitwise comparisons.

One verification runs five processes (about 20 s on 2 cores); the sabotage test reuses its reference
paths and runs only its own full resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from andrea.control import andreactl
from andrea.control.verify_resume.engine import EXIT_MISMATCH, EXIT_OK, REPORT_NAME
from andrea.control.verify_resume.trainer import (
    TRAINER_CHECKPOINT_EVERY,
    TRAINER_TOTAL_STEPS,
    run_trainer,
)
from andrea.daemon.rundir.layout import bin_name, manifest_name

FINAL = bin_name(TRAINER_TOTAL_STEPS)


@pytest.fixture(scope="module")
def proof(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[int, dict[str, Any], Path]:
    output = tmp_path_factory.mktemp("proof") / "trainer"
    code = run_trainer(output, cache_dir=cache_dir)
    return code, json.loads((output / REPORT_NAME).read_text()), output


def _comparison(report: dict[str, Any], section: str, prefix: str) -> dict[str, Any]:
    return next(c for c in report[section] if c["name"].startswith(prefix))


def test_full_resume_is_bit_exact_and_both_negatives_diverge(
    proof: tuple[int, dict[str, Any], Path],
) -> None:
    code, report, output = proof
    failed = [c["name"] for c in report["full_resume"] + report["checks"] if not c["passed"]]
    assert code == EXIT_OK, (report["error"], failed)
    assert report["completed"] and report["all_checks_passed"]
    assert report["positive"] is True and report["negative_divergence_detected"] is True
    assert report["tolerance"] == {"absolute": 0.0, "relative": 0.0}

    stop = report["stop_step"]
    assert 0 < stop < TRAINER_TOTAL_STEPS and stop % TRAINER_CHECKPOINT_EVERY != 0
    stop_manifest = json.loads((output / "stop" / manifest_name(stop)).read_text())
    assert stop_manifest["trigger"] == "sigterm"
    assert any(c["position"] > 0 for c in stop_manifest["data"])

    continuous = (output / "continuous" / FINAL).read_bytes()
    full = report["figures"]["full_resume"]
    assert (
        full["bin_identical_to_continuous"]
        and (output / "full_resume" / FINAL).read_bytes() == continuous
    )
    assert full["max_weight_diff_vs_continuous"] == full["max_m_diff_vs_continuous"] == 0.0
    assert full["max_v_diff_vs_continuous"] == full["final_loss_diff_vs_continuous"] == 0.0
    for negative in ("no_rng_resume", "no_cursor_resume"):
        figures = report["figures"][negative]
        assert not figures["bin_identical_to_continuous"]
        assert (output / negative / FINAL).read_bytes() != continuous
        assert figures["max_weight_diff_vs_continuous"] > 0.0
        assert figures["next_lr"] == full["next_lr"]  # bookkeeping right, trajectory wrong

    # Each negative drifts where the state it skipped matters, and only there.
    batches = f"batches: arm, tokens, sha256 (steps {stop + 1}-{TRAINER_TOTAL_STEPS})"
    assert _comparison(report, "no_rng_resume", batches)["passed"]
    assert _comparison(report, "no_rng_resume", "random generator states")["diverged"]
    assert _comparison(report, "no_cursor_resume", batches)["diverged"]
    assert _comparison(report, "no_cursor_resume", "data cursors")["diverged"]
    assert _comparison(report, "no_cursor_resume", "random generator states")["passed"]
    for negative in ("no_rng_resume", "no_cursor_resume"):
        assert _comparison(report, negative, "losses")["diverged"]
        assert _comparison(report, negative, "learning rates")["passed"]
        assert _comparison(report, negative, "final weights")["diverged"]


def test_a_sabotaged_resume_fails_the_verification(
    proof: tuple[int, dict[str, Any], Path],
    tmp_path: Path,
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    output = tmp_path / "sabotaged"
    code = andreactl.main(
        [
            "--json",
            "verify-resume",
            "--output",
            str(output),
            "--problem",
            "trainer",
            "--sabotage",
            "skip-cursor",
            "--reuse",
            str(proof[2]),
            "--cache-dir",
            str(cache_dir),
        ]
    )
    assert code == EXIT_MISMATCH
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((output / REPORT_NAME).read_text())
    assert report["completed"] and not report["positive"] and not report["all_checks_passed"]
    assert report["sabotage"] == "skip-cursor"
    # Only the sabotaged resume ran; the reference paths are the passed proof's.
    assert sorted(p.name for p in output.iterdir()) == ["full_resume", "logs", REPORT_NAME]
    failed = {c["name"].split(" (")[0] for c in report["full_resume"] if not c["passed"]}
    assert {"batches: arm, tokens, sha256", "losses", "final weights", "data cursors"} <= failed
    assert not report["figures"]["full_resume"]["bin_identical_to_continuous"]
