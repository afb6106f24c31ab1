"""Adding an arm kind is adding its module: a kind registered here, in the test, and nowhere else
(CSV files, one document per row, the column `field` names) is validated by the config, trained
on by the trainer's loading, identified by the proxy's identity, estimated by `andreactl plan`,
read by `andrea-trainer --check` and copied by an export's resume recipe, with no other module
edited."""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tomli_w
from pydantic import ValidationError

from andrea.control.datasize import estimated
from andrea.control.export.resume import resume_recipe
from andrea.daemon.config import ArmSpec, ConfigError, build_config
from andrea.daemon.data.arms import ArmStream, arm_documents, arm_identity, load_arms
from andrea.daemon.data.encoding import Document
from andrea.daemon.data.kinds import registry
from andrea.daemon.data.kinds.files import DocumentFiles, label
from andrea.daemon.data.kinds.registry import Reading
from andrea.daemon.data.sources import DEFAULT_FIELD, DataError, Roots, read_file
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.trainer.service.cli import build_parser
from andrea.daemon.trainer.service.preflight import run_check


def _rows(spec: ArmSpec, path: Path, data: bytes) -> Iterator[tuple[int, str]]:
    """The column `field` of each row after the header, numbered from 1."""
    field = spec.field or DEFAULT_FIELD
    rows = csv.reader(io.StringIO(data.decode()))
    header = next(rows, [])
    if field not in header:
        raise DataError(f"{label(spec)}{path}: no column {field!r} (its columns: {header})")
    for number, row in enumerate(rows, 1):
        yield number, row[header.index(field)]


class Csv(DocumentFiles):
    """The toy kind: a CSV file's rows, the text in column `field` (default "text")."""

    name = "csv"
    summary = "glob patterns of CSV files, one document per row: the column field"
    settings = DocumentFiles.settings | {"field"}

    def salt(self, spec: ArmSpec) -> str:
        return f"csv:v1:{spec.field or DEFAULT_FIELD}"

    def read(
        self, spec: ArmSpec, files: list[Path], common: Path, reading: Reading, inside: Roots
    ) -> Iterator[Document]:
        for f in files:
            data = read_file(f, inside, reading.should_stop, reading.meter, reading.bound)
            for number, text in _rows(spec, f, data):
                yield f"{f.relative_to(common).as_posix()}:{number}", text

    def first_record(self, spec: ArmSpec, path: Path, common: Path, bound: int) -> bool:
        return next(_rows(spec, path, read_file(path, bound=bound)), None) is not None


@pytest.fixture
def csv_kind() -> Iterator[None]:
    registry.register(Csv())
    try:
        yield
    finally:
        registry.unregister("csv")


ARM = {"name": "table", "kind": "csv", "paths": ["tables/*.csv"], "field": "body"}
ROWS = [f"row {i}: some words of the table" for i in range(200)]


def _run(tmp_path: Path, arm: dict[str, object] = ARM) -> Path:
    run = tmp_path / "run"
    (run / "tables").mkdir(parents=True)
    lines = ["id,body"] + [f"{i},{text}" for i, text in enumerate(ROWS)]
    (run / "tables" / "a.csv").write_text("\n".join(lines[:101]) + "\n")
    (run / "tables" / "b.csv").write_text("\n".join(lines[:1] + lines[101:]) + "\n")
    config = {
        "preset": "andrea-tiny",
        "data": {"arms": [arm], "cache_dir": str(tmp_path / "cache"), "heldout_fraction": 0.0},
    }
    (run / "run.toml").write_text(tomli_w.dumps(config))
    return run


def test_a_kind_registered_by_its_module_alone_is_read_trained_planned_and_checked(
    tmp_path: Path, csv_kind: None, caplog: pytest.LogCaptureFixture
) -> None:
    run = _run(tmp_path)
    cfg = build_config({}, {"preset": "andrea-tiny", "data": {"arms": [ARM]}})
    data = cfg.data.model_copy(update={"cache_dir": str(tmp_path / "cache")})
    spec = data.arms[0]
    assert spec.encoded
    docs = list(arm_documents(spec, run))
    assert docs[0] == ("a.csv:1", ROWS[0]) and docs[100] == ("b.csv:1", ROWS[100])
    assert [text for _, text in docs] == ROWS
    # The trainer's arm: the rows encoded (bytes), the proxy's identity the trainer's.
    (arm,) = load_arms(data, run, cfg.model.vocab_size)
    assert bytes(np.asarray(arm.tokens)).decode() == "\n\n".join(ROWS)
    assert arm_identity(spec, data, run, cfg.model.vocab_size) == arm.identity
    assert ArmStream(arm, cfg.seed, cfg.model.block_size).next_batch(2).shape == (
        2,
        cfg.model.block_size + 1,
    )
    # Its salt is its own: a text arm over the same files is another identity.
    text = data.model_copy(
        update={"arms": [ArmSpec(name="table", kind="text", paths=["tables/*.csv"])]}
    )
    assert arm_identity(text.arms[0], text, run, cfg.model.vocab_size) != arm.identity
    # andreactl plan's estimate: the files' bytes, a token a byte.
    plan = estimated(cfg, run)
    assert plan is not None
    assert plan.tokens == sum(f.stat().st_size for f in (run / "tables").iterdir())
    # andrea-trainer --check reads each file's first row: a start would start.
    args = build_parser().parse_args(["--run-dir", str(run), "--check"])
    with caplog.at_level(logging.INFO):
        assert run_check(args) == ExitCode.OK
    # An export's resume recipe copies its files into the new run directory.
    assert f"cp -R {run}/tables/. " in resume_recipe(run, "step_000010", None)


def test_the_check_refuses_a_bad_file_of_the_new_kind_as_the_start_would(
    tmp_path: Path, csv_kind: None, caplog: pytest.LogCaptureFixture
) -> None:
    run = _run(tmp_path, {**ARM, "field": "text"})
    args = build_parser().parse_args(["--run-dir", str(run), "--check"])
    with caplog.at_level(logging.INFO):
        assert run_check(args) == ExitCode.DATA_ERROR
    assert "arm 'table': " in caplog.text and "a.csv: no column 'text'" in caplog.text


def test_the_config_knows_the_new_kind_and_its_settings(csv_kind: None) -> None:
    assert "csv" in registry.names()
    schema = ArmSpec.model_json_schema()["properties"]["kind"]
    assert "csv" in schema["enum"]
    with pytest.raises(ValidationError, match="links is a setting of csv, jsonl, parquet"):
        ArmSpec.model_validate({"name": "a", "kind": "stdlib", "part": "code", "links": "follow"})
    with pytest.raises(ValidationError, match="kind 'csv' needs paths"):
        ArmSpec.model_validate({"name": "a", "kind": "csv"})


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ConfigError) as refused:
        build_config({}, {"data": {"arms": [{"name": "a", "kind": "csv", "paths": ["*"]}]}})
    assert "'csv' is not an arm kind; the kinds: jsonl, parquet, stdlib, text, tokens" in str(
        refused.value
    )
