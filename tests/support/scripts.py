"""The project's scripts (scripts/*.py, and the benchmarks' tests/bench/*.py), loaded as modules for
the tests that call their functions in-process."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str, folder: str = "scripts") -> ModuleType:
    """`folder`/`name`.py as the module `name` (registered in sys.modules, as dataclasses need)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_check(tmp_path: Path, dry_run: bool = True) -> Any:
    """scripts/gpu_check.py's `Check`, its work and report under `tmp_path`, two minutes' budget."""
    report_dir = tmp_path / "report"
    report_dir.mkdir()
    gpu_check = load_script("gpu_check")
    return gpu_check.Check(
        dry_run, tmp_path, tmp_path / "cache", time.monotonic() + 120, report_dir
    )


def report(check: Any) -> str:
    """The report a `Check` wrote so far."""
    return (check.report_dir / "report.md").read_text()
