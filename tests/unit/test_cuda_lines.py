"""scripts/cuda_lines.py: which of coverage's missed lines sit behind a CUDA condition."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.support.daemons import REPO
from tests.support.scripts import load_script

cuda_lines = load_script("cuda_lines")

SOURCE = textwrap.dedent(
    """\
    import torch


    def early(device, x):
        if device.type != "cuda":
            return x
        y = x.cuda()
        return y


    def branches(device):
        a = 1
        if device.type == "cuda":
            a = 2
        else:
            a = 3
        if a > 2:
            a = 4
        while a < 9:
            if torch.cuda.is_available():
                break
            a += 1
        return a


    def restore(state, device):
        if state.torch_cuda and device is not None:
            return 1
        if device.type == "cuda" or device is None:
            return 2
        return 3
    """
)


def write(tmp_path: Path, rel: str, source: str) -> None:
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def report(tmp_path: Path, files: dict[str, list[int]]) -> dict:
    return {"files": {str(tmp_path / p): {"missing_lines": m} for p, m in files.items()}}


def test_only_the_missed_lines_behind_a_cuda_test_count(tmp_path: Path) -> None:
    write(tmp_path, "daemon/x.py", SOURCE)
    write(tmp_path, "tests/x.py", SOURCE)
    every_line = list(range(1, SOURCE.count("\n") + 1))
    found = cuda_lines.cuda_only_missed(
        report(tmp_path, {"daemon/x.py": every_line, "tests/x.py": every_line}), tmp_path
    )
    # Read off SOURCE: what follows the CPU's early return (7-8), the CUDA branch of the two-way
    # test (14), the `break` the CPU never takes (21), the branch only CUDA-made data enters (28);
    # not the CPU's branches (6, 16, 22 after the `break`), nor 12 (before any test), 17-18 (a test
    # without CUDA) or 30 (entered on the CPU too, with no device).
    assert sorted(found) == ["daemon/x.py"]
    assert sorted(found["daemon/x.py"]) == [7, 8, 14, 21, 28]


def test_gpu_checks_dry_run_tests_and_cuda_only_callees_count() -> None:
    check = (REPO / "scripts" / "gpu_check.py").read_text().splitlines()
    dry = next(i for i, line in enumerate(check, 1) if line.strip() == "if check.dry_run:")
    guarded = cuda_lines.guarded_lines("scripts/gpu_check.py", "\n".join(check))
    assert dry + 3 in guarded and dry + 1 not in guarded and dry + 2 not in guarded
    writer = (REPO / "daemon" / "checkpoint" / "writer.py").read_text().splitlines()
    start = next(i for i, line in enumerate(writer, 1) if "def _copy_aside" in line)
    stream = next(i for i, line in enumerate(writer[start:], start + 1) if "wait_stream" in line)
    guarded = cuda_lines.guarded_lines("daemon/checkpoint/writer.py", "\n".join(writer))
    assert stream in guarded and start not in guarded
    # ready(): the event it waits on is set only by the CUDA copy.
    sync = next(i for i, line in enumerate(writer, 1) if "self._event.synchronize()" in line)
    assert sync in guarded and sync - 1 not in guarded


def test_the_command_prints_the_count_and_refuses_a_bad_report(tmp_path: Path, capsys) -> None:
    write(tmp_path, "control/y.py", SOURCE)
    (tmp_path / "r.json").write_text(
        json.dumps(report(tmp_path, {"control/y.py": [6, 7, 12, 14, 16]}))
    )
    assert cuda_lines.main([str(tmp_path / "r.json"), "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "control/y.py:7  (1; guard line 5" in out and "control/y.py:14  (1;" in out
    assert out.splitlines()[-1] == "2 CUDA-only lines never executed, in 1 files"
    (tmp_path / "bad.json").write_text("{")
    assert cuda_lines.main([str(tmp_path / "bad.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
