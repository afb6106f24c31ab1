"""The real trainer's resume proof: fresh andrea-trainer processes, a real SIGTERM, bitwise comparisons.

One verification runs five processes (about 20 s on 2 cores); the sabotage test reuses its reference
paths and runs only its own full resume.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from andrea.control.verify_resume.engine import EXIT_INCOMPLETE, REPORT_NAME
from andrea.control.verify_resume.trainer import (
    run_trainer,
)


@pytest.fixture(scope="module")
def proof(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[int, dict[str, Any], Path]:
    output = tmp_path_factory.mktemp("proof") / "trainer"
    code = run_trainer(output, cache_dir=cache_dir)
    return code, json.loads((output / REPORT_NAME).read_text()), output


def test_refusals_come_before_any_process(tmp_path: Path) -> None:
    assert run_trainer(tmp_path / "unknown", sabotage="skip-everything") == EXIT_INCOMPLETE
    assert not (tmp_path / "unknown").exists()
    (tmp_path / "evidence").mkdir()
    assert run_trainer(tmp_path / "evidence") == EXIT_INCOMPLETE
    assert list((tmp_path / "evidence").iterdir()) == []
