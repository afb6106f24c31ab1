"""The environment a checkpoint records, and which of its fields make a resume inexact."""

from __future__ import annotations

import platform as host

import numpy as np
import torch

from andrea.daemon.checkpoint.manifest import Environment, Sharding, code_version
from andrea.daemon.trainer.parts import Platform
from andrea.daemon.trainer.platform import cudaenv
from andrea.daemon.trainer.platform.world import World

#: Environment fields whose change makes a resume inexact (the versions of Python, NumPy and
#: the code are recorded for the audit: they do not change the arithmetic of a step).
EXACTNESS_FIELDS = (
    "device",
    "dtype",
    "threads",
    "torch_version",
    "compiled",
    "sharding",
    "deterministic",
    "gpu",
    "compute_capability",
    "cuda_driver",
    "cuda_runtime",
    "cudnn",
    "nccl",
)


def environment_of(
    platform: Platform, world: World, compiled: bool, sharding: Sharding = "replicated"
) -> Environment:
    """This process's environment, as a manifest records it (`sharding`: the strategy's)."""
    return Environment(
        device=str(platform.device),
        dtype=platform.numerics.recorded,
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        numpy_version=np.__version__,
        python_version=host.python_version(),
        code_version=code_version(),
        world_size=world.size,
        deterministic=platform.deterministic,
        **cudaenv.describe(platform.device),
        compiled=compiled,
        sharding=sharding,
    )


def inexact_changes(then: Environment, now: Environment) -> list[str]:
    """The exactness fields that differ between a checkpoint's environment and this one."""
    a, b = then.model_dump(), now.model_dump()
    return [f"{k}: {a[k]} → {b[k]}" for k in EXACTNESS_FIELDS if a[k] != b[k]]
