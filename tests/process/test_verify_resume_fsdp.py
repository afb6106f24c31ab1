"""The resume proof under FSDP, run as docs/distributed.md tells a user to: `andreactl
verify-resume --problem trainer --nproc 2 --config fsdp.toml`, the config naming `[distributed]
strategy = "fsdp"`. Each path is a torchrun job of 2 FSDP ranks; the full resume must end on the
continuous path's bytes and both negative controls (the RNGs or the data cursors not restored)
must diverge, each where the state it skipped matters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.control.verify_resume.engine import EXIT_OK, REPORT_NAME
from andrea.control.verify_resume.trainer import TRAINER_TOTAL_STEPS
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.rundir.layout import bin_name, manifest_name

FSDP_TOML = """preset = "andrea-tiny"
threads = 1
device = "cpu"

[distributed]
strategy = "fsdp"
"""


def test_the_proof_passes_under_fsdp_and_its_negative_controls_diverge(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fsdp.toml").write_text(FSDP_TOML)
    output = tmp_path / "proof"
    argv = ["--json", "verify-resume", "--problem", "trainer", "--nproc", "2"]
    argv += ["--config", str(tmp_path / "fsdp.toml"), "--output", str(output)]
    code = andreactl.main([*argv, "--cache-dir", str(cache_dir)])
    report = json.loads(capsys.readouterr().out)
    failed = [c["name"] for c in report["full_resume"] + report["checks"] if not c["passed"]]
    assert code == EXIT_OK, (report["error"], failed)
    assert report["positive"] is True and report["negative_divergence_detected"] is True
    assert report == json.loads((output / REPORT_NAME).read_text())

    final = bin_name(TRAINER_TOTAL_STEPS)
    continuous = (output / "continuous" / final).read_bytes()
    assert (output / "full_resume" / final).read_bytes() == continuous
    for negative in ("no_rng_resume", "no_cursor_resume"):
        assert (output / negative / final).read_bytes() != continuous
        assert report["figures"][negative]["max_weight_diff_vs_continuous"] > 0.0
    stop = report["stop_step"]
    for path, step in (("continuous", TRAINER_TOTAL_STEPS), ("stop", stop),
                       ("full_resume", TRAINER_TOTAL_STEPS)):  # fmt: skip
        manifest = Manifest.model_validate_json((output / path / manifest_name(step)).read_text())
        assert manifest.environment.sharding == "fsdp", (path, manifest.environment)
        assert manifest.environment.world_size == 2, (path, manifest.environment)
