"""`kind = "parquet"`: glob patterns of Parquet files (the Hub's ``data/train-*.parquet``), one
document per row, the string in the arm's ``field`` column (default ``"text"``), its id
``<relative path>:<row number>`` (daemon/data/parquet.py reads them, with pyarrow)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from andrea.daemon.config import ArmSpec
from andrea.daemon.data.encoding import Document
from andrea.daemon.data.kinds.files import DocumentFiles, label
from andrea.daemon.data.kinds.registry import Reading, register
from andrea.daemon.data.parquet import check_parquet, parquet_documents, text_bytes
from andrea.daemon.data.sources import DEFAULT_FIELD, Roots

log = logging.getLogger(__name__)


class Parquet(DocumentFiles):
    name = "parquet"
    summary = "glob patterns of Parquet files, one document per row: the string column field"
    settings = DocumentFiles.settings | {"field"}

    def salt(self, spec: ArmSpec) -> str:
        return f"parquet:v1:{spec.field or DEFAULT_FIELD}"

    def read(
        self, spec: ArmSpec, files: list[Path], common: Path, reading: Reading, inside: Roots
    ) -> Iterator[Document]:
        field = spec.field or DEFAULT_FIELD
        return parquet_documents(
            files,
            common,
            field,
            reading.should_stop,
            label(spec),
            inside,
            reading.bound,
            reading.meter,
        )

    def first_record(self, spec: ArmSpec, path: Path, common: Path, bound: int) -> bool:
        # The footer, never a row (a row group may be hundreds of MB).
        if check_parquet(path, spec.field or DEFAULT_FIELD, label(spec)):
            return True
        log.warning("arm %r: %s holds no rows", spec.name, path)
        return False

    def text_size(self, spec: ArmSpec, path: Path) -> float:
        """The text column's size, from the file's metadata (not the compressed file's)."""
        return text_bytes(path, spec.field or DEFAULT_FIELD)


register(Parquet())
