"""`kind = "text"`: glob patterns of text files, one document each, its id the file's path
relative to the arm's files' common directory (daemon/data/sources.py reads them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from andrea.daemon.config import ArmSpec
from andrea.daemon.data.encoding import Document
from andrea.daemon.data.kinds.files import DocumentFiles, label
from andrea.daemon.data.kinds.registry import Reading, register
from andrea.daemon.data.sources import DataError, Roots, arm_files, oversize_text, text_documents


class Text(DocumentFiles):
    name = "text"
    summary = "glob patterns of text files, one document each"

    def salt(self, spec: ArmSpec) -> str:
        return "text:v1"

    def read(
        self, spec: ArmSpec, files: list[Path], common: Path, reading: Reading, inside: Roots
    ) -> Iterator[Document]:
        return text_documents(
            files, common, reading.should_stop, inside, reading.meter, reading.bound, label(spec)
        )

    def before_identity(self, spec: ArmSpec, reading: Reading) -> None:
        # A file is one document: one over the bound is refused at once, before the files are
        # hashed (read_file checks again, should the file grow meanwhile).
        for f in arm_files(spec, reading.base)[0]:
            if (size := f.stat().st_size) > reading.bound:
                raise DataError(oversize_text(label(spec), f, size, reading.bound))

    def first_record(self, spec: ArmSpec, path: Path, common: Path, bound: int) -> bool:
        first = next(text_documents([path], common, bound=bound, label=label(spec)), None)
        return bool(first and first[1])


register(Text())
