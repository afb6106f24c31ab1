"""The registry of arm kinds: what `kind = "..."` of an arm of run.toml selects.

An `ArmKind` says everything the code asks of a kind: which of `ArmSpec`'s settings it takes and
needs, whether the run's tokenizer encodes it, how its documents are read and identified (or, for
a kind that holds ids already, how its arm is loaded), what `andrea-trainer --check` reads of it,
what `andreactl plan` estimates its size from, and which of its paths an export's resume recipe
copies. The config (daemon/config.py), the data (daemon/data/arms.py), `--check`
(daemon/trainer/service/preflight.py) and the tools (control/) look a kind up here, never by its
name.

Every module of this package registers its kinds when it is imported, and the registry imports
them all on its first lookup: adding a kind is adding its module. Nothing is imported here at
the top (the config imports this module, and the kinds import the config).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from andrea.daemon.config import ArmSpec, DataConfig
    from andrea.daemon.data.arms import Arm
    from andrea.daemon.data.encoding import Document
    from andrea.daemon.data.sources import Meter, Stop


@dataclass
class Reading:
    """What reading an arm's files needs beside the arm: the run directory its paths are relative
    to, a stop to honour, the longest document (`[data] max_document_bytes`), what counts the
    bytes read, and what the arms of one load share (the standard library's documents, extracted
    once for its three parts)."""

    base: Path
    bound: int
    should_stop: Stop = None
    meter: Meter | None = None
    shared: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Source:
    """An arm's documents to encode, how many bytes of files they come from, and what counts the
    bytes read (None: the documents are in memory, their own bytes are counted)."""

    docs: Iterable[Document]
    total_bytes: int
    meter: Meter | None = None


@dataclass(frozen=True)
class Maker:
    """Which tokenizer made an arm's ids: its identity (None: unknown), where that is said, and
    the file the arm names."""

    identity: str | None
    where: str
    file: Path


class ArmKind:
    """One kind of arm. A kind whose text the run's tokenizer encodes (`encoded`) gives its
    documents and their identity, and the data module encodes and caches them; a kind of ids
    (`encoded` False) loads its arm itself (`load`)."""

    #: What `kind = "..."` says.
    name: str = ""
    #: What an arm of the kind reads, in a few words (for the config's docs and refusals).
    summary: str = ""
    #: `ArmSpec`'s settings the kind takes, beyond name, kind and weight.
    settings: frozenset[str] = frozenset()
    #: The setting an arm of the kind cannot do without, and how a refusal says it.
    needs: tuple[str, str] | None = None
    #: Whether the run's tokenizer encodes the arm's text (False: it holds ids already).
    encoded: bool = True

    def check(self, spec: ArmSpec) -> str | None:
        """What is wrong with an arm of the kind as configured, beyond the settings it does not
        take (the config refuses those); None when nothing is."""
        if self.needs is not None and not getattr(spec, self.needs[0]):
            return f"arm {spec.name!r}: kind {self.name!r} needs {self.needs[1]}"
        return None

    # An encoded kind's documents.
    def source_identity(self, spec: ArmSpec, reading: Reading) -> str:
        """The identity of the arm's sources (before the tokenizer and the held-out split name
        theirs): a kind's own salt, so that it never equals another kind's over the same files."""
        raise NotImplementedError(f"kind {self.name!r} holds ids, not documents")

    def documents(self, spec: ArmSpec, reading: Reading) -> Iterable[Document]:
        """The arm's documents `(id, text)` in order: the unit of the held-out split."""
        raise ValueError(f"arm {spec.name!r} is a {self.name} arm: it holds ids, not documents")

    def source(self, spec: ArmSpec, reading: Reading) -> Source:
        """The documents to encode, and the bytes of files they come from (for the progress)."""
        raise NotImplementedError(f"kind {self.name!r} holds ids, not documents")

    def before_identity(self, spec: ArmSpec, reading: Reading) -> None:
        """What the start refuses before it hashes the arm's files (gigabytes take minutes)."""

    # A kind of ids.
    def load(
        self,
        spec: ArmSpec,
        cfg: DataConfig,
        base: Path,
        cache: Path,
        vocab_size: int,
        tokenizer: str,
    ) -> Arm:
        """The arm, its identity naming its ids and its held-out split (`tokenizer`: the run's
        tokenizer's identity, which its ids must be made by)."""
        raise NotImplementedError(f"kind {self.name!r} is encoded by the run's tokenizer")

    def made_by(self, spec: ArmSpec, base: Path) -> Maker | None:
        """Which tokenizer made the arm's ids; None for an arm the run's tokenizer encodes."""
        return None

    def notes(self, spec: ArmSpec, cfg: DataConfig, base: Path) -> list[tuple[str, Path]]:
        """Warnings about the arm's files once it is loaded, each with the file it is about
        (said once per file, not at every start)."""
        return []

    # The checks and the tools.
    def first_records(self, spec: ArmSpec, base: Path, bound: int) -> bool:
        """What `andrea-trainer --check` reads beyond the identity: the first record of each of
        the arm's files, refused (DataError naming the arm, the file, the record) as the start
        would refuse it. False when the files hold no document at all."""
        return True

    def size_estimate(self, spec: ArmSpec, base: Path, shared: dict[str, Any]) -> float:
        """For `andreactl plan`: the bytes of text the arm holds (an encoded kind), or its tokens
        (a kind of ids). Nothing is tokenized; `shared`: what the arms of one estimate share."""
        return 0.0

    def export_paths(self, arm: dict[str, Any]) -> list[str]:
        """The paths (globs) of an arm, as run.toml writes it (unchecked), that an export's resume
        recipe must provide in the new run directory."""
        return []


_KINDS: dict[str, ArmKind] = {}
_LOADED = threading.RLock()
_loaded = False


def register(kind: ArmKind) -> ArmKind:
    """Add `kind` to the registry (a module of this package does so when imported)."""
    if not kind.name:
        raise ValueError(f"{type(kind).__name__} has no name")
    if kind.name in _KINDS and type(_KINDS[kind.name]) is not type(kind):
        raise ValueError(f"arm kind {kind.name!r} is registered already")
    _KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Remove a kind (a test's own, once it is done)."""
    _KINDS.pop(name, None)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    with _LOADED:
        if not _loaded:
            package = __name__.rsplit(".", 1)[0]
            for module in pkgutil.iter_modules(importlib.import_module(package).__path__):
                importlib.import_module(f"{package}.{module.name}")
            _loaded = True


def names() -> list[str]:
    """The registered kinds, in alphabetical order."""
    _load()
    return sorted(_KINDS)


def find(name: object) -> ArmKind | None:
    """The kind called `name`; None when there is none (a config read without validation)."""
    _load()
    return _KINDS.get(name) if isinstance(name, str) else None


def kind(name: str) -> ArmKind:
    """The kind called `name` (a validated config's: ValueError naming the kinds otherwise)."""
    found = find(name)
    if found is None:
        raise ValueError(f"{name!r} is not an arm kind (the kinds: {', '.join(names())})")
    return found


def taking(setting: str) -> list[str]:
    """The kinds that take `setting`."""
    return [n for n in names() if setting in _KINDS[n].settings]
