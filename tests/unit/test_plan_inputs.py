"""What `andreactl plan` takes and what it must not claim (issue 33, items A5 and B10): every
absurd figure refused with exit 2 and the CLI's error report; a floor under the step time; the
MFU's source said, never a CPU's carried to a GPU; the passes over the run's own data; and
`$ANDREA_RUN_DIR` honoured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from andrea.control import andreactl
from andrea.control.commands.conventions import EXIT_USAGE
from andrea.control.reports import report_adapter

TOKENS_ARM = '[[data.arms]]\nname = "pre"\nkind = "tokens"\npath = "pre.u16"\ndtype = "uint16"\n'


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = andreactl.main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


FLOATS = (
    "--gpu-memory-gb", "--gpu-tflops", "--gpu-allreduce-gbps", "--disk-gbps", "--staging-gbps",
    "--startup-seconds", "--mfu",
)  # fmt: skip
ABSURD = [(o, v) for o in FLOATS for v in ("nan", "inf", "-inf", "1e300", "-1")]
ABSURD += [(o, "0") for o in ("--batch-size", "--grad-accum", "--gpus", "--gpu-memory-gb")]
ABSURD += [("--gpus", "-2"), ("--steps", "-1"), ("--batch-size", "-8")]
ABSURD += [("--days", v) for v in ("0", "-1", "nan", "inf", "1e6")]


@pytest.mark.parametrize("option,value", ABSURD)
def test_an_absurd_figure_is_refused(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each used to be replaced by the preset's value (0), or to end in a ValueError or an
    OverflowError traceback, or in "nan GB/s" with null hours."""
    code, out, err = plan(capsys, "--preset", "andrea-tiny", f"{option}={value}")
    assert code == EXIT_USAGE, (out, err)
    assert option in err and "out of range" in err and "Traceback" not in err, err
    code, out, _ = plan(capsys, "--preset", "andrea-tiny", f"{option}={value}", "--json")
    assert (
        code == EXIT_USAGE
        and json.loads(out)["exit_code"] == EXIT_USAGE
        and option in json.loads(out)["error"]
    )


def test_the_figures_at_their_bounds_are_taken(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = plan(
        capsys, "--preset", "andrea-tiny", "--gpu-memory-gb", "10000", "--startup-seconds", "0",
        "--steps", "0", "--mfu", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert report_adapter("plan").validate_json(out).speed.steps == 0


def test_a_tiny_model_is_not_planned_at_no_time_a_step(capsys: pytest.CaptureFixture[str]) -> None:
    """andrea-tiny's arithmetic is microseconds on an H200; its step is the host's dispatch."""
    argv = ("--preset", "andrea-tiny", "--gpu", "h200", "--steps", "200000")
    code, out, err = plan(capsys, *argv, "--json")
    assert code == 0, err
    s = report_adapter("plan").validate_json(out).speed
    assert s.compute_seconds < 1e-4 < s.floor_seconds == s.step_seconds
    assert s.training_seconds == pytest.approx(200_000 * s.floor_seconds)
    code, text, _ = plan(capsys, *argv)
    assert " 0.0 ms per step" not in text and "the host's dispatch" in text, text
    # A large model's arithmetic is above the floor: it is not floored.
    code, out, _ = plan(capsys, "--preset", "andrea-120m", "--gpu", "l40s", "--json")
    s = report_adapter("plan").validate_json(out).speed
    assert s.step_seconds == pytest.approx(s.compute_seconds + s.allreduce_seconds)
    assert s.step_seconds > s.floor_seconds


def test_a_configs_passes_are_estimated_from_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = 50_000
    np.zeros(ids, dtype="<u2").tofile(tmp_path / "pre.u16")
    (tmp_path / "run.toml").write_text(
        f"batch_size = 8\n[data]\nheldout_fraction = 0.1\n{TOKENS_ARM}"
    )
    code, out, err = plan(
        capsys, "--config", str(tmp_path / "run.toml"), "--steps", "1000", "--json"
    )
    assert code == 0, err
    p = report_adapter("plan").validate_json(out)
    assert p.data is not None and p.data.training_tokens == int(ids * 0.9)
    assert "estimated from the arms' file sizes" in p.data.how
    planned = 1000 * 8 * 64  # steps x sequences x andrea-tiny's block
    assert p.data.planned_tokens == planned
    assert p.data.passes == pytest.approx(planned / int(ids * 0.9))
    assert any(w.startswith(f"{p.data.passes:,.1f} passes over") for w in p.warnings), p.warnings
    code, out, _ = plan(capsys, "--config", str(tmp_path / "run.toml"), "--steps", "50", "--json")
    assert not any("passes over" in w for w in json.loads(out)["warnings"])


def test_a_preset_says_its_passes_are_not_known(capsys: pytest.CaptureFixture[str]) -> None:
    code, text, _ = plan(capsys, "--preset", "andrea-tiny")
    assert code == 0 and "data: passes not known" in text, text


def _window(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    code, out, err = plan(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plan_days_gives_the_steps_and_tokens_a_window_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 50: `plan --days N`, backwards. Without cadences (no checkpoint, no evaluation) the
    rental is the steps' time plus one stop, resume and export: the window holds
    floor((N days - those) / step time) steps, each of tokens_per_step tokens."""
    config = tmp_path / "run.toml"
    config.write_text('preset = "andrea-120m"\n[checkpoint]\nevery = 0\n[eval]\nevery = 0\n')
    figures = ("--config", str(config), "--gpu", "h100", "--mfu", "0.4")
    for days in (0.5, 3.0, 7.0):
        p = _window(capsys, *figures, "--days", str(days))
        fixed = (p["rental"]["stop_resume_hours"] + p["rental"]["export_hours"]) * 3600
        step = p["speed"]["step_seconds"]
        steps = int((days * 86_400 - fixed) // step)
        assert p["window"]["steps"] == steps == p["speed"]["steps"]
        assert p["window"]["tokens"] == steps * p["batch"]["tokens_per_step"]
        assert p["window"]["hours"] == pytest.approx(steps * step / 3600 + fixed / 3600)
        assert p["window"]["hours"] <= days * 24 < p["window"]["hours"] + step / 3600
    # With cadences: the steps fit, and one more step would not.
    p = _window(capsys, "--preset", "andrea-12m", "--gpu", "a100-80gb", "--days", "1")
    steps = p["window"]["steps"]
    assert p["rental"]["total_hours"] <= 24
    more = _window(
        capsys, "--preset", "andrea-12m", "--gpu", "a100-80gb", "--steps", str(steps + 1)
    )
    assert more["rental"]["total_hours"] > 24
    # A window shorter than a stop, a resume and an export holds no step.
    p = _window(capsys, *figures, "--days", "0.0001")
    assert p["window"]["steps"] == 0 and p["window"]["tokens"] == 0
    code, _, err = plan(capsys, *figures, "--days", "1", "--steps", "10")
    assert code == EXIT_USAGE and "give --steps or --days, not both" in err
