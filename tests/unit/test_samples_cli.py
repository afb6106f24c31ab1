"""`andreactl samples`: decoded text under separators (not reprs), the archived phases with
--all-phases, and a missing file explained (a --mixing fixed run writes none)."""

from __future__ import annotations

from pathlib import Path

from andrea.control import andreactl
from andrea.daemon.mixing.proxyfiles import SampleRecord, SamplesFile
from andrea.daemon.rundir.layout import PIVOT_RECORD, SAMPLES_FILE
from andrea.protocol.messages import Sample


def _record(step: int, phase: int, text: str) -> SampleRecord:
    return SampleRecord(step=step, segment=1, phase=phase, received_utc="2026-01-01T00:00:00Z",
                        arm_mix={"code": 3}, samples=[Sample(prompt="def", text=text)])  # fmt: skip


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    archive = run / "archive" / "pivot-000100-20260101T000000Z"
    archive.mkdir(parents=True)
    (archive / PIVOT_RECORD).write_text("{}")
    SamplesFile(kept=4, records=[_record(100, 0, "def old():\n\treturn 'a'")]).write(
        archive / SAMPLES_FILE
    )
    SamplesFile(kept=4, records=[_record(200, 1, "def new():\n    pass")]).write(run / SAMPLES_FILE)
    return run


def test_samples_print_text_with_separators_and_all_phases(tmp_path: Path, capsys) -> None:
    run = _run(tmp_path)
    assert andreactl.main(["samples", "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "=== step 200 · segment 1 · phase 1" in out and "--- sample 1 (prompt 'def') ---" in out
    assert "def new():\n    pass" in out and "\\n" not in out and "old" not in out
    assert andreactl.main(["samples", "--run-dir", str(run), "--all-phases", "--last", "0"]) == 0
    out = capsys.readouterr().out
    assert out.index("def old():\n\treturn 'a'") < out.index("def new():")


def test_a_run_without_samples_is_told_why(tmp_path: Path, capsys) -> None:
    assert andreactl.main(["samples", "--run-dir", str(tmp_path)]) == 1
    assert "--mixing fixed (no proxy) writes no .samples.json" in capsys.readouterr().err
