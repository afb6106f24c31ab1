"""scripts/gpu_check.py's own plumbing, on the CPU: what the one try on a GPU machine depends on
(the report written as it goes, a failed child's log in it, children that log to their pipe, no
git needed, eager runs that are eager, an activation miss that warns) and the formatting of the
CUDA figures it reports."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.scripts import load_script, make_check, report

gpu_check = load_script("gpu_check")


def test_the_report_is_on_disk_after_every_line(tmp_path) -> None:
    check = make_check(tmp_path)
    check.section("Speed", 30)
    assert "## Speed" in report(check) and "_budget: 30 s_" in report(check)
    check.add("| a row |")
    assert report(check).rstrip().endswith("| a row |")


def test_the_commit_is_optional(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on this PATH
    assert gpu_check.code_version() == "unknown (no git on this machine)"


def test_an_activation_miss_is_a_warning_not_a_failure(tmp_path) -> None:
    check = make_check(tmp_path)
    rows = [
        gpu_check.activation_row(True, 8, 13 * 2**30, 10 * 2**30),
        gpu_check.activation_row(False, 1, 2**30, 2**30),
    ]
    gpu_check.activation_verdict(check, rows)
    assert check.ok and check.warnings == 1
    assert "| on | 8 | 13.00 | 10.00 | 1.30 |" in report(check)
    assert "**WARNING**: plan's activation estimate is 1.30 x" in report(check)


class Recording(gpu_check.Check):
    """Records the commands instead of running them: what the speed section asks for."""

    def run(self, cmd, limit, stop_at=None, **env):  # type: ignore[override]
        self.commands.append((cmd, env))
        return gpu_check.Result(0, "", 0.0)


def test_eager_runs_are_eager_and_the_compiled_run_compiles(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(gpu_check, "activation_check", lambda check: None)
    check = Recording(False, tmp_path, tmp_path / "cache", time.monotonic() + 60)
    check.commands = []
    gpu_check.call_speed(check)
    trainers = [(c, env) for c, env in check.commands if "andrea.daemon.trainer.service.cli" in c]
    compile_ = {
        Path(c[c.index("--run-dir") + 1]).name: c[c.index("--compile") + 1] for c, _ in trainers
    }
    assert compile_ == {
        "compiled": "on",
        "eager-det": "off",
        "eager-nondet": "off",
        "eager-math": "off",
    }
    forced = {Path(c[c.index("--run-dir") + 1]).name: env for c, env in trainers}
    assert forced["eager-math"] == {"ANDREA_BENCH_SDPA_BACKENDS": "MATH"}
    assert "--precision" in trainers[0][0] and "andrea-120m" in trainers[0][0]


def test_cuda_figures_are_formatted(tmp_path) -> None:
    env = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "cuda_driver": "580.65.06"}
    env |= {"cuda_runtime": "13.0", "cudnn": "91300", "nccl": "2.28.3"}
    assert gpu_check.gpu_rows(env) == [
        ("GPU", "NVIDIA H200 (compute capability 9.0)"),
        ("driver", "580.65.06"),
        ("CUDA", "13.0"),
        ("cuDNN", "91300"),
        ("NCCL", "2.28.3"),
    ]
    # The MFU's peak, by the names torch.cuda.get_device_name gives (dense bf16, the vendor's).
    assert gpu_check.peak_of("NVIDIA H200") == 989.0
    assert gpu_check.peak_of("NVIDIA L40S") == 362.0 and gpu_check.peak_of("NVIDIA L4") == 121.0
    assert gpu_check.peak_of("NVIDIA H100 PCIe") == 756.0
    assert gpu_check.peak_of("Tesla V100-SXM2-16GB") is None


def test_unknown_sections_are_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        gpu_check.parse(["--report-dir", str(tmp_path), "--sections", "install,sped"])
    assert "unknown sped" in capsys.readouterr().err
