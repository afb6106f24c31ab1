"""The trainer package's layering contract (pyproject.toml, id `trainer-layers`) catches an import
that climbs back up: checked in-process with import-linter on a copy of daemon/, once as it is
(kept) and once with one climbing import added (broken)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from importlinter import configuration
from importlinter.application.use_cases import create_report, read_user_options
from importlinter.application.user_options import UserOptions
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import registry

ROOT = Path(__file__).resolve().parents[2]
CONTRACT_ID = "trainer-layers"
# The copy's package name: unique, so that nothing else on sys.path answers to it.
PROBE = "andrea_layers_probe"


def trainer_contract() -> dict[str, Any]:
    """The contract as lint-imports reads it from pyproject.toml, pointed at the copy's trainer."""
    configuration.configure()
    options = read_user_options(str(ROOT / "pyproject.toml"))
    (contract,) = [c for c in options.contracts_options if c.get("id") == CONTRACT_ID]
    assert contract["containers"] == ["andrea.daemon.trainer"]
    return {**contract, "containers": [f"{PROBE}.trainer"]}


def copy_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """daemon/'s modules as the package PROBE: the trainer's relative imports resolve inside the
    copy; its absolute `andrea.` imports are outside it, as the contract's layers never use them."""
    probe = tmp_path / PROBE
    shutil.copytree(ROOT / "daemon", probe, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    return probe / "trainer"


def check() -> tuple[bool, dict[str, Any]]:
    """(kept, metadata) of the contract on the copy (found on sys.path by its package name), its
    graph built fresh: no cache."""
    registry.register(LayersContract, "layers")  # what lint-imports does before it reads a config
    options = UserOptions(
        session_options={"root_packages": [PROBE]}, contracts_options=[trainer_contract()]
    )
    report = create_report(options, cache_dir=None)
    assert not report.could_not_run and not report.invalid_contract_options
    ((_, result),) = list(report.get_contracts_and_checks())
    return result.kept, result.metadata


def climbs(metadata: dict[str, Any]) -> set[tuple[str, str]]:
    """Each (lower layer, higher layer it reaches), without the copy's package prefix."""
    prefix = f"{PROBE}.trainer."
    return {
        (d["importer"].removeprefix(prefix), d["imported"].removeprefix(prefix))
        for d in metadata["invalid_dependencies"]
    }


def test_the_trainer_package_as_it_is_keeps_its_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy_daemon(tmp_path, monkeypatch)
    kept, metadata = check()
    assert kept, (climbs(metadata), metadata["undeclared_modules"])


@pytest.mark.parametrize(
    ("module", "line", "climb"),
    [
        # The climbs of issue 48: a module below the loop reaching into the entry.
        ("sink.py", "from .service.cli import main", ("sink", "service")),
        ("context.py", "from .service import start", ("context", "service")),
        # A link to the outside world reaching back into the loop.
        ("links/control_server.py", "from ..loop import Trainer", ("links", "loop")),
        # Inside the loop's layers: a part reaching the collaborator built from it.
        ("parts.py", "from .step import StepRunner", ("parts", "step")),
    ],
)
def test_an_import_that_climbs_back_up_breaks_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, line: str, climb: tuple[str, str]
) -> None:
    trainer = copy_daemon(tmp_path, monkeypatch)
    with (trainer / module).open("a") as f:
        f.write(f"\n{line}\n")
    kept, metadata = check()
    assert not kept
    assert climb in climbs(metadata)


def test_a_module_given_no_layer_breaks_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = copy_daemon(tmp_path, monkeypatch)
    (trainer / "newcomer.py").write_text('"""A module nobody placed."""\n')
    kept, metadata = check()
    assert not kept
    assert metadata["undeclared_modules"] == {f"{PROBE}.trainer.newcomer"}
