"""The checkpoint file: written, read back and checked before its fingerprint marks it usable; loaded
only after its fingerprint, restricted loading and every check of :mod:`.validation` pass."""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from andrea.control.mini_problem.experiment import LiveRun, generator_states
from andrea.control.mini_problem.schema import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    CheckpointInfo,
    Identity,
    LoadedCheckpoint,
)
from andrea.control.mini_problem.validation import (
    check_consistency,
    check_identity,
    parse_checkpoint,
)
from andrea.daemon.rundir.durable import atomic_write_bytes


def checkpoint_payload(run: LiveRun, identity: Identity) -> dict[str, Any]:
    """What the checkpoint of ``run`` holds: the whole state that decides the next update, and the
    identity it belongs to."""
    return {
        "format": CHECKPOINT_FORMAT,
        "config": identity.config.model_dump(),
        "code_version": identity.code_version,
        "data_identity": identity.data_identity,
        "versions": identity.versions.model_dump(),
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "rng": generator_states(run.generator),
        "progress": {
            "step": run.step,
            "epoch": run.epoch,
            "cursor": run.cursor,
            "permutation": list(run.permutation),
        },
        "history": [record.model_dump() for record in run.history],
    }


def save_checkpoint(path: Path, payload: Mapping[str, Any], identity: Identity) -> CheckpointInfo:
    """Write the checkpoint, re-read it, and only then mark it usable by writing its fingerprint.

    The fingerprint file is in ``sha256sum`` format (``sha256sum -c`` accepts it); its comment line
    carries the byte size, which the loader checks too.
    """
    buffer = io.BytesIO()
    torch.save(dict(payload), buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    # The re-read proves the file on disk is complete and loadable the restricted way. Full consistency
    # (progress, history, optimizer steps) is the loader's judgement, made when someone resumes from it.
    reread = path.read_bytes()
    if reread != data:
        raise OSError(f"{path}: the bytes read back differ from the bytes written")
    digest = hashlib.sha256(data).hexdigest()
    check_identity(
        parse_checkpoint(
            torch.load(io.BytesIO(reread), map_location="cpu", weights_only=True),
            identity.config,
            digest,
        ),
        identity,
    )
    fingerprint = f"# {CHECKPOINT_FORMAT}, {len(data)} bytes\n{digest}  {path.name}\n"
    atomic_write_bytes(_fingerprint_path(path), fingerprint.encode())
    return CheckpointInfo(file=path.name, sha256=digest, bytes=len(data))


def _fingerprint_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


_SIZE_LINE = re.compile(r"^# .*, (\d+) bytes$")
_HASH_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def _read_fingerprint(path: Path) -> tuple[str, int]:
    fingerprint = _fingerprint_path(path)
    if not fingerprint.is_file():
        raise CheckpointError(
            f"{fingerprint}: missing; a checkpoint without its fingerprint was never marked usable"
        )
    sizes: list[int] = []
    hashes: list[tuple[str, str]] = []
    for line in fingerprint.read_text(encoding="utf-8", errors="replace").splitlines():
        if size := _SIZE_LINE.match(line):
            sizes.append(int(size.group(1)))
        elif entry := _HASH_LINE.match(line):
            hashes.append((entry.group(1), entry.group(2)))
        elif line.strip():
            raise CheckpointError(f"{fingerprint}: unexpected line {line[:80]!r}")
    if len(sizes) != 1 or len(hashes) != 1:
        raise CheckpointError(f"{fingerprint}: expected one size line and one sha256 line")
    digest, name = hashes[0]
    if name != path.name:
        raise CheckpointError(f"{fingerprint}: fingerprints {name!r}, not {path.name!r}")
    return digest, sizes[0]


def load_checkpoint(path: Path, identity: Identity) -> LoadedCheckpoint:
    """Load a checkpoint for resuming, or raise :class:`CheckpointError` saying why it cannot be used.

    Checked before anything is used: fingerprint (size and sha256), restricted loading
    (``weights_only=True``), schema (every key, type and shape), identity (config, code, data,
    versions) and the consistency of progress, history, optimizer and scheduler with each other.
    """
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    digest, size = _read_fingerprint(path)
    # Hash and load the same bytes, so that the file cannot change between the check and the use.
    data = path.read_bytes()
    if len(data) != size:
        raise CheckpointError(
            f"{path}: {len(data)} bytes, its fingerprint says {size} (truncated or replaced)"
        )
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise CheckpointError(
            f"{path}: sha256 {actual} does not match its fingerprint {digest} (corrupted or modified)"
        )
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # the restricted unpickler raises several types; all mean "unusable"
        raise CheckpointError(f"{path}: cannot be loaded with weights_only=True: {exc}") from exc
    checkpoint = parse_checkpoint(obj, identity.config, digest)
    check_identity(checkpoint, identity)
    check_consistency(checkpoint, identity.config)
    return checkpoint
