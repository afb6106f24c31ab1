"""andreactl plan and size: the exact figures against torch's own (parameters, AdamW's state, the
checkpoint), the activation estimate against torch's measured peak on CPU, and the plan of the
issue's example, every figure present. (The same figures against a real run's checkpoint:
tests/process/test_elastic.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from andrea.control import andreactl


def plan(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = andreactl.main(["plan", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_is_torch_free() -> None:
    code = (
        "import sys; from andrea.control import andreactl;"
        " c = andreactl.main(['plan', '--preset', 'andrea-120m', '--json']);"
        " print(c, 'torch' in sys.modules, file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().splitlines()[-1] == "0 False", out.stderr
