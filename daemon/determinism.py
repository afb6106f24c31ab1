"""The deterministic mode: what it switches on, and the context the training step runs in.

On by default on CUDA (setting ``deterministic = "auto"``), where it is what makes a resume — or a
second run — reproduce the first bit for bit; off by default on CPU, where the kernels this model
uses are deterministic already at a fixed thread count. Recorded in the manifest's
``environment.deterministic``, so a resume that changes it is announced as not bit-exact.

What "on" means:
- ``torch.use_deterministic_algorithms(True)``: an op without a deterministic implementation
  raises instead of silently varying;
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which cuBLAS needs for reproducible matmuls (set before
  the first cuBLAS call; a value the operator set is kept);
- cuDNN deterministic, its autotuner off;
- attention through the math backend of ``scaled_dot_product_attention`` only: the flash and
  cuDNN backends accumulate dQ with atomics in the backward pass, so their results vary run to run.
Its cost was not measured on a GPU yet (scripts/gpu_check.py measures it).
"""

from __future__ import annotations

import contextlib
import os
from typing import Literal

import torch

Deterministic = Literal["auto", "on", "off"]

CUBLAS_WORKSPACE = ":4096:8"


def resolve(setting: Deterministic, device: torch.device) -> bool:
    """Whether the mode is on for `device`: auto means on for CUDA, off for CPU."""
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


def apply(on: bool) -> None:
    """Switch the process-wide settings; call before the first CUDA kernel runs."""
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if torch.are_deterministic_algorithms_enabled() != on:
        # Only when it changes: the call imports torch's compiler stack (seconds at start-up).
        torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False


def attention(on: bool, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The context the forward and backward passes run in: math attention only when on (CUDA)."""
    if not on or device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])
