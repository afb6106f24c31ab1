"""What the kinds whose `paths` globs name files of documents share (text, jsonl, parquet): the
files an arm's globs match (daemon/data/sources.py: regular files only, links kept inside the
arm's directories), their identity, `--check`'s first record of each, their size for
`andreactl plan`, and the globs an export's resume recipe copies. A kind of such files says how
one file's documents are read (`read`), its first record (`first_record`) and its salt."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from andrea.daemon.config import ArmSpec
from andrea.daemon.data import corpus
from andrea.daemon.data.encoding import Document
from andrea.daemon.data.kinds.registry import ArmKind, Reading, Source
from andrea.daemon.data.sources import DEFAULT_FIELD, Meter, Roots, arm_files, arm_roots


class DocumentFiles(ArmKind):
    """A kind whose arms name files of documents by `paths` globs."""

    settings = frozenset({"paths", "links"})
    needs = ("paths", "paths = [glob, ...]")

    def salt(self, spec: ArmSpec) -> str:
        """What the identity of the arm's files begins with: the kind's own, with a version, and
        every setting that changes which documents the same files hold."""
        raise NotImplementedError

    def read(
        self, spec: ArmSpec, files: list[Path], common: Path, reading: Reading, inside: Roots
    ) -> Iterator[Document]:
        """The documents of `files` (their ids relative to `common`), in order; a bad record a
        DataError naming the arm, the file and the record."""
        raise NotImplementedError

    def first_record(self, spec: ArmSpec, path: Path, common: Path, bound: int) -> bool:
        """Read the first record of one file, as the start would; False when it holds none."""
        raise NotImplementedError

    def text_size(self, spec: ArmSpec, path: Path) -> float:
        """The bytes of text one file holds (for `andreactl plan`): its size, unless the kind
        knows better."""
        return float(path.stat().st_size)

    def source_identity(self, spec: ArmSpec, reading: Reading) -> str:
        files, common = arm_files(spec, reading.base)
        inside = arm_roots(spec, reading.base)
        return corpus.listing_digest(files, common, self.salt(spec), reading.should_stop, inside)

    def documents(self, spec: ArmSpec, reading: Reading) -> Iterable[Document]:
        files, common = arm_files(spec, reading.base)
        return self.read(spec, files, common, reading, arm_roots(spec, reading.base))

    def source(self, spec: ArmSpec, reading: Reading) -> Source:
        files, _ = arm_files(spec, reading.base)
        meter = Meter()
        counted = Reading(reading.base, reading.bound, reading.should_stop, meter, reading.shared)
        docs = self.documents(spec, counted)
        return Source(docs, sum(f.stat().st_size for f in files), meter)

    def first_records(self, spec: ArmSpec, base: Path, bound: int) -> bool:
        files, common = arm_files(spec, base)
        found = False
        for f in files:
            found = self.first_record(spec, f, common, bound) or found
        return found

    def size_estimate(self, spec: ArmSpec, base: Path, shared: dict[str, Any]) -> float:
        files, _ = arm_files(spec, base)
        return sum(self.text_size(spec, f) for f in files)

    def export_paths(self, arm: dict[str, Any]) -> list[str]:
        paths = arm.get("paths")
        return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else []


def label(spec: ArmSpec) -> str:
    """What a refusal of one of the arm's files begins with."""
    return f"arm {spec.name!r}: "


class FieldRecordFiles(DocumentFiles):
    """A kind whose files hold one document per record, the string at the arm's `field` (JSON
    Lines, Parquet): the field is part of the identity's salt, and `reader` reads the files."""

    settings = DocumentFiles.settings | {"field"}
    #: The kind's reader: (files, common, field, should_stop, label, inside, bound, meter).
    reader: Callable[..., Iterator[Document]]

    def field(self, spec: ArmSpec) -> str:
        return spec.field or DEFAULT_FIELD

    def salt(self, spec: ArmSpec) -> str:
        return f"{self.name}:v1:{self.field(spec)}"

    def read(
        self, spec: ArmSpec, files: list[Path], common: Path, reading: Reading, inside: Roots
    ) -> Iterator[Document]:
        return self.reader(
            files,
            common,
            self.field(spec),
            reading.should_stop,
            label(spec),
            inside,
            reading.bound,
            reading.meter,
        )
