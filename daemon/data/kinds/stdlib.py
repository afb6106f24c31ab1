"""`kind = "stdlib"`: a part (docstrings, code or comments) of the Python standard library's
source tree, the embedded default corpus present wherever Python is (daemon/data/corpus.py). Its
three parts come from one pass over the same files: the arms of one load share the files'
listing and the extracted documents (`Reading.shared`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from andrea.daemon.config import ArmSpec
from andrea.daemon.data import corpus
from andrea.daemon.data.encoding import Document
from andrea.daemon.data.kinds.registry import ArmKind, Reading, Source, register
from andrea.daemon.data.sources import DataError

log = logging.getLogger(__name__)

_IDENTITIES = "stdlib:identities"
_DOCUMENTS = "stdlib:documents"
_COUNTED = "stdlib:counted"


def _files() -> tuple[Path, list[Path]]:
    root = corpus.stdlib_root()
    files = corpus.stdlib_files(root)
    if not files:
        raise DataError(f"no Python sources found under {root}")
    return root, files


class Stdlib(ArmKind):
    name = "stdlib"
    summary = "a part (docstrings, code or comments) of the Python standard library's source"
    settings = frozenset({"part"})
    needs = ("part", "part = docstrings|code|comments")

    def source_identity(self, spec: ArmSpec, reading: Reading) -> str:
        if _IDENTITIES not in reading.shared:
            # Every part's, the files read and hashed once for all of them.
            root, files = _files()
            reading.shared[_IDENTITIES] = corpus.stdlib_identities(corpus.PARTS, files, root)
        identities: dict[str, str] = reading.shared[_IDENTITIES]
        return identities[spec.stdlib_part()]

    def _extracted(self, reading: Reading) -> dict[str, list[tuple[str, bytes]]]:
        if _DOCUMENTS not in reading.shared:  # once, for every part
            root, files = _files()
            log.info("building the default corpus from %d files under %s (once)", len(files), root)
            reading.shared[_DOCUMENTS] = corpus.extract_stdlib_documents(
                files, root, reading.should_stop
            )
        documents: dict[str, list[tuple[str, bytes]]] = reading.shared[_DOCUMENTS]
        return documents

    def documents(self, spec: ArmSpec, reading: Reading) -> Iterable[Document]:
        return self._extracted(reading)[spec.stdlib_part()]

    def source(self, spec: ArmSpec, reading: Reading) -> Source:
        docs = self._extracted(reading)[spec.stdlib_part()]
        return Source(docs, sum(len(d) for _, d in docs))

    def size_estimate(self, spec: ArmSpec, base: Path, shared: dict[str, Any]) -> float:
        # The three parts together are the files: counted once, with the first stdlib arm.
        if shared.get(_COUNTED):
            return 0.0
        shared[_COUNTED] = True
        return float(sum(p.stat().st_size for p in corpus.stdlib_files()))


register(Stdlib())
