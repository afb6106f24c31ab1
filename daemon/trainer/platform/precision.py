"""Device and numeric precision of the training step: what the `device` and `precision` settings mean.

The master weights and Adam's m and v are always float32 (the checkpoint format stores nothing else);
what changes is the arithmetic of the forward and backward passes:

- ``fp32``: plain float32 everywhere (matmul precision "highest"). The CPU default.
- ``tf32``: float32 tensors, CUDA matmuls on TF32 tensor cores (10-bit mantissa inputs, float32
  accumulation). CUDA only.
- ``bf16``: the forward pass under ``torch.autocast(dtype=bfloat16)`` — matmuls and attention in
  bfloat16, softmax, norms and the loss in float32 as autocast's op lists decide — and TF32 for the
  float32 matmuls that remain. The CUDA default where the GPU supports bfloat16. Allowed on CPU too,
  where it is rarely faster.

Each mode is as reproducible as the others at a fixed device, thread count and torch version, but
they differ from one another in the low bits from the first step on. The name recorded in the
manifest's ``environment.dtype`` (:attr:`NumericMode.recorded`) is compared at resume, so moving a
run from one mode to another is announced as not bit-exact.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Literal

import torch

from andrea.daemon.config import ConfigError, Precision


@dataclass(frozen=True)
class NumericMode:
    """A resolved precision: the name the manifest records and the two torch settings it implies."""

    recorded: str
    autocast_dtype: torch.dtype | None
    matmul_precision: Literal["highest", "high"]

    def apply(self) -> None:
        """Set torch's process-wide float32 matmul precision (TF32 on CUDA when "high")."""
        torch.set_float32_matmul_precision(self.matmul_precision)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[None]:
        """The context the forward pass (and the loss) runs in."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)


# "float32" is what manifests written before this setting existed record: an fp32 run stays comparable.
FP32 = NumericMode("float32", None, "highest")
TF32 = NumericMode("float32-tf32", None, "high")
BF16_CUDA = NumericMode("bfloat16-autocast", torch.bfloat16, "high")
# On CPU "high" may let oneDNN use reduced-precision kernels for the float32 ops autocast leaves
# alone; keep those exact so that CPU bf16 means exactly "autocast, nothing else".
BF16_CPU = NumericMode("bfloat16-autocast", torch.bfloat16, "highest")


def resolve_device(want: str) -> torch.device:
    """The device the `device` setting (auto|cpu|cuda) means here; ConfigError if it cannot be had."""
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device 'cuda' requested but CUDA is not available (torch sees no GPU); use auto or cpu"
        )
    return torch.device(
        "cuda" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu"
    )


def resolve(precision: Precision, device: torch.device) -> NumericMode:
    """The mode `precision` means on `device`; ConfigError for a combination the device cannot run."""
    cuda = device.type == "cuda"
    if precision == "auto":
        if not cuda:
            return FP32
        return BF16_CUDA if torch.cuda.is_bf16_supported() else TF32
    if precision == "fp32":
        return FP32
    if precision == "tf32":
        if not cuda:
            raise ConfigError(
                "precision 'tf32' needs a CUDA device (TF32 is a tensor-core format); use fp32 or bf16 on CPU"
            )
        return TF32
    if cuda and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"precision 'bf16': {torch.cuda.get_device_name(device)} does not support bfloat16; use tf32"
        )
    return BF16_CUDA if cuda else BF16_CPU
