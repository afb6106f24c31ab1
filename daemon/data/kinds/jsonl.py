"""`kind = "jsonl"`: glob patterns of JSON Lines files (``.jsonl``, ``.jsonl.gz``,
``.jsonl.zst``), one document per line, the string at the arm's ``field`` (default ``"text"``),
its id ``<relative path>:<line number>`` (daemon/data/sources.py reads them)."""

from __future__ import annotations

import io
import logging
import zlib
from pathlib import Path

from andrea.daemon.config import ArmSpec
from andrea.daemon.data.kinds.files import FieldRecordFiles, label
from andrea.daemon.data.kinds.registry import register
from andrea.daemon.data.sources import jsonl_documents
from andrea.daemon.data.zstdstream import ZstdDataError, ZstdReader

log = logging.getLogger(__name__)

#: Compressed bytes at the head of a .gz or .zst file whose ratio sizes the whole file.
RATIO_SAMPLE = 1 << 20
#: The most decompressed bytes that sample is read to (a bomb's ratio is not worth computing).
RATIO_LIMIT = 64 << 20


class JsonLines(FieldRecordFiles):
    name = "jsonl"
    summary = "glob patterns of JSON Lines files, one document per line: the string at field"
    reader = staticmethod(jsonl_documents)

    def first_record(self, spec: ArmSpec, path: Path, common: Path, bound: int) -> bool:
        field = self.field(spec)
        if next(jsonl_documents([path], common, field, label=label(spec), bound=bound), None):
            return True
        log.warning("arm %r: %s holds no JSON Lines records", spec.name, path)
        return False

    def text_size(self, spec: ArmSpec, path: Path) -> float:
        """A compressed file's size after decompression, estimated from its head's ratio."""
        size = path.stat().st_size
        if not path.name.endswith((".gz", ".zst")):
            return size
        with path.open("rb") as f:
            head = f.read(RATIO_SAMPLE)
        if path.name.endswith(".gz"):
            unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out = len(unzip.decompress(head, RATIO_LIMIT))
            except zlib.error:
                return size
            used = len(head) - len(unzip.unconsumed_tail) - len(unzip.unused_data)
        else:
            reader = ZstdReader(io.BytesIO(head))
            out = 0
            try:
                while out < RATIO_LIMIT and (chunk := reader.read(1 << 20)):
                    out += len(chunk)
            except ZstdDataError:  # the head ends inside a frame: as expected
                pass
            used = reader.consumed
        return size * out / used if used else size


register(JsonLines())
