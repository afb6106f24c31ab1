"""The `precision` setting: bf16 autocast really changes the arithmetic, resumes bit-exactly within
its own mode, is recorded in the manifest, and a resume under another mode is announced as inexact.

On CPU (all CI has) this covers fp32 and bf16; tf32 and the CUDA branch of `auto` need a GPU.
"""

from __future__ import annotations

import pytest
import torch

from andrea.daemon.config import ConfigError
from andrea.daemon.trainer.platform.precision import BF16_CPU, FP32, resolve


def test_resolve_on_cpu() -> None:
    cpu = torch.device("cpu")
    assert resolve("auto", cpu) is FP32 and resolve("fp32", cpu) is FP32
    assert resolve("bf16", cpu) is BF16_CPU
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        resolve("tf32", cpu)
