"""The identity a checkpoint must share with the process that resumes it: config, code version,
data identity and library versions."""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import numpy as np
import torch

from andrea.control.mini_problem.experiment import make_dataset
from andrea.control.mini_problem.schema import Identity, MiniConfig, Versions

#: The mini problem's package: its source, all of it, is the code version.
PACKAGE_DIR = Path(__file__).resolve().parent


def data_identity(x: np.ndarray, y: np.ndarray) -> str:
    """sha256 of the data set's exact bytes (little-endian float64, shapes included)."""
    digest = hashlib.sha256(b"andrea-mini-data/1")
    for array in (x, y):
        digest.update(repr(array.shape).encode())
        digest.update(np.ascontiguousarray(array, dtype="<f8").tobytes())
    return digest.hexdigest()


def source_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The files :func:`code_version` hashes: every ``.py`` file of the package, in a fixed order."""
    return sorted(package_dir.rglob("*.py"))


def code_version(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 of the package's source, file by file with their names: an edit to any module (or a
    module added, removed or renamed) makes older checkpoints another experiment."""
    digest = hashlib.sha256(b"andrea-mini-code/1")
    for path in source_files(package_dir):
        data = path.read_bytes()
        digest.update(f"{path.relative_to(package_dir).as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def current_versions() -> Versions:
    """This process's interpreter and library versions."""
    return Versions(python=platform.python_version(), torch=torch.__version__, numpy=np.__version__)


def current_identity(config: MiniConfig) -> Identity:
    """The identity of this process's experiment, to stamp on or check against a checkpoint."""
    x, y = make_dataset(config)
    return Identity(config, code_version(), data_identity(x, y), current_versions())
