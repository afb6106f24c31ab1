"""The `step_NNNNNN.bin` checkpoint payload: the seed's format, readable with numpy alone.

Layout (little-endian, no padding, no alignment)::

    int32 step | int32 n_params | float32 weights[n] | float32 m[n] | float32 v[n]

so a file is exactly ``8 + 12 * n_params`` bytes. ``m`` and ``v`` are AdamW's first and second
moments, stored in the same flattened parameter order as the weights (the model's parameter
iterator). Everything else a resume needs lives in the JSON manifest beside it (`manifest.py`).

This module imports numpy only, on purpose: it is the reference reader for third parties.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER = struct.Struct("<ii")
DTYPE = np.dtype("<f4")
INT32_MAX = 2**31 - 1


class PayloadError(ValueError):
    """A file that is not a well-formed checkpoint payload."""


def payload_size(n_params: int) -> int:
    return HEADER.size + 3 * DTYPE.itemsize * n_params


@dataclass(frozen=True)
class Payload:
    step: int
    n_params: int
    weights: np.ndarray
    m: np.ndarray
    v: np.ndarray


def read_header(path: Path) -> tuple[int, int]:
    with open(path, "rb") as f:
        raw = f.read(HEADER.size)
    if len(raw) != HEADER.size:
        raise PayloadError(f"{path}: {len(raw)} bytes, shorter than the 8-byte header")
    return HEADER.unpack(raw)


def read_payload(path: str | os.PathLike[str], mmap: bool = True) -> Payload:
    """Read a checkpoint payload. With ``mmap`` the three arrays are read-only views of the file.

    Only the structure is checked here (header and exact size); the manifest's sha256 is what
    proves the content (see `checkpoint.verify`).
    """
    path = Path(path)
    step, n = read_header(path)
    if n < 0 or step < 0:
        raise PayloadError(f"{path}: negative header field (step={step}, n_params={n})")
    size = path.stat().st_size
    if size != payload_size(n):
        raise PayloadError(f"{path}: {size} bytes, but n_params={n} needs {payload_size(n)}")
    flat: np.ndarray
    if mmap:
        flat = np.memmap(path, dtype=DTYPE, mode="r", offset=HEADER.size, shape=(3 * n,))
    else:
        flat = np.fromfile(path, dtype=DTYPE, offset=HEADER.size, count=3 * n)
    return Payload(step, n, flat[:n], flat[n : 2 * n], flat[2 * n :])


def unflatten(
    flat: np.ndarray, layout: Iterable[tuple[str, tuple[int, ...], int]]
) -> dict[str, np.ndarray]:
    """Split one of the three flat arrays into named tensors with the manifest's layout
    (name, shape, element offset)."""
    out = {}
    for name, shape, offset in layout:
        count = int(np.prod(shape, dtype=np.int64))
        out[name] = flat[offset : offset + count].reshape(shape)
    return out
