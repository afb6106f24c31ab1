"""`kind = "parquet"`: glob patterns of Parquet files (the Hub's ``data/train-*.parquet``), one
document per row, the string in the arm's ``field`` column (default ``"text"``), its id
``<relative path>:<row number>`` (daemon/data/parquet.py reads them, with pyarrow)."""

from __future__ import annotations

import logging
from pathlib import Path

from andrea.daemon.config import ArmSpec
from andrea.daemon.data.kinds.files import FieldRecordFiles, label
from andrea.daemon.data.kinds.registry import register
from andrea.daemon.data.parquet import check_parquet, parquet_documents, text_bytes

log = logging.getLogger(__name__)


class Parquet(FieldRecordFiles):
    name = "parquet"
    summary = "glob patterns of Parquet files, one document per row: the string column field"
    reader = staticmethod(parquet_documents)

    def first_record(self, spec: ArmSpec, path: Path, common: Path, bound: int) -> bool:
        # The footer, never a row (a row group may be hundreds of MB).
        if check_parquet(path, self.field(spec), label(spec)):
            return True
        log.warning("arm %r: %s holds no rows", spec.name, path)
        return False

    def text_size(self, spec: ArmSpec, path: Path) -> float:
        """The text column's size, from the file's metadata (not the compressed file's)."""
        return text_bytes(path, self.field(spec))


register(Parquet())
