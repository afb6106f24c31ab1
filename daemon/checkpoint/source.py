"""A checkpoint of another run that a new run starts from (`andrea-trainer --init-from
PATH/step_NNNNNN.bin`): found, read, compared with the new run's model, and described for the new
run's lineage.

Only the weights (and with `--init-from-optimizer` Adam's moments and step count) come from it:
the new run has its own config, data, policy, schedule and random streams. Read-only: the source
run directory is never written.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manager import verify_payload
from andrea.daemon.checkpoint.manifest import MAX_MANIFEST_BYTES, Manifest, decode_manifest
from andrea.daemon.config import ModelConfig
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.boundedio import irregular, read_bounded
from andrea.protocol.lineage import InitSource

#: What makes two models the same shape: every setting but dropout, which holds no parameter, and
#: the compute-only ones (activation recompute).
SHAPE_FIELDS = tuple(
    k for k in ModelConfig.model_fields if k != "dropout" and k not in ModelConfig.COMPUTE_ONLY
)


class SourceError(ValueError):
    """The --init-from path is not an intact checkpoint this run can start from; says why. A
    mistake of the command line, wherever it is found (exit 2): a missing file, a damaged manifest
    or a damaged payload alike."""


@dataclass(frozen=True)
class Source:
    """A source checkpoint whose manifest has been read and verified (its payload not yet)."""

    path: Path
    manifest: Manifest
    #: The manifest file's bytes, as read (their SHA-256 goes into the lineage).
    raw_manifest: bytes

    @property
    def run_dir(self) -> Path:
        return self.path.parent

    def content(self) -> dict[str, Any]:
        """The manifest as a JSON object, exactly as its file holds it."""
        return json.loads(self.raw_manifest)

    def describe(self, optimizer: bool) -> InitSource:
        """What the new run's lineage records of it."""
        m = self.manifest
        return InitSource(
            path=str(self.path),
            step=m.step,
            bin_sha256=m.bin_sha256,
            manifest_sha256=hashlib.sha256(self.raw_manifest).hexdigest(),
            preset=m.config.get("preset") if isinstance(m.config.get("preset"), str) else None,
            config_hash=m.config_hash,
            optimizer=optimizer,
        )

    def payload(self) -> checkpoint_format.Payload:
        """The verified payload (size, header and sha256 against the manifest)."""
        try:
            return verify_payload(self.run_dir, self.manifest, None)
        except (ValueError, OSError) as e:
            raise SourceError(f"--init-from {self.path}: not intact: {e}") from None


def read_source(path: Path) -> Source:
    """The checkpoint at `path` (a `step_NNNNNN.bin` beside its manifest), its manifest verified.
    SourceError naming the path and the problem."""
    path = path.expanduser().absolute()
    try:
        kind = irregular(path, follow_symlinks=True)
    except FileNotFoundError:
        raise SourceError(f"--init-from {path}: no such file") from None
    except OSError as e:
        raise SourceError(f"--init-from {path}: {e.strerror or e}") from None
    if kind is not None:
        raise SourceError(f"--init-from {path}: not a regular file ({kind}): not a checkpoint")
    parsed = rundir.parse_checkpoint_name(path.name)
    if parsed is None or parsed[1] != "bin":
        raise SourceError(f"--init-from {path}: not a checkpoint payload (step_NNNNNN.bin)")
    try:
        raw = read_bounded(path.parent / rundir.manifest_name(parsed[0]), MAX_MANIFEST_BYTES)
        manifest = decode_manifest(raw)
    except (ValueError, OSError) as e:
        raise SourceError(f"--init-from {path}: its manifest is not intact: {e}") from None
    if manifest.step != parsed[0]:
        raise SourceError(f"--init-from {path}: its manifest says step {manifest.step}")
    return Source(path, manifest, raw)


def shape_differences(source: ModelConfig, model: ModelConfig) -> list[str]:
    """Each shape setting in which `model` differs from the source's, as `key: source → run`."""
    return [
        f"{k}: {getattr(source, k)} → {getattr(model, k)}"
        for k in SHAPE_FIELDS
        if getattr(source, k) != getattr(model, k)
    ]
