"""The deterministic mode: what it switches on, and the context the training step runs in.

On by default on CUDA (setting ``deterministic = "auto"``), where it is what makes a resume — or a
second run — reproduce the first bit for bit; off by default on CPU, where the kernels this model
uses are deterministic already at a fixed thread count. Recorded in the manifest's
``environment.deterministic``, so a resume that changes it is announced as not bit-exact.

What "on" means, and why each part (sources: docs/performance.md, "The deterministic mode"):

- ``torch.use_deterministic_algorithms(True)``: an op without a deterministic implementation
  raises instead of silently varying. It also makes the flash and memory-efficient attention
  backends run their deterministic backward passes (flash: ``deterministic=true`` for
  ``mha_bwd``; memory-efficient: one key split), and takes cuDNN attention out of SDPA's choice
  (``check_cudnn_deterministic``) — so attention keeps its fast kernels. And it makes Inductor pick
  one configuration per reduction kernel by rule instead of by timing, which is what keeps a
  compiled step's summation order the same in every process.
- ``torch.utils.deterministic.fill_uninitialized_memory`` off: ``use_deterministic_algorithms``
  also fills every new ``torch.empty`` with NaN, a kernel per allocation, for code that reads
  memory it never wrote; nothing here does, and the fill is not what makes sums repeat.
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which cuBLAS needs for reproducible matmuls (set before
  the first cuBLAS call; a value the operator set is kept);
- cuDNN deterministic, its autotuner off;
- Inductor's own deterministic switch (``torch._inductor.config.deterministic``, and
  ``TORCHINDUCTOR_DETERMINISTIC=1`` for the compile workers it starts): no kernel chosen by timing
  on the device, so a compiled step repeats from one process to the next;
- in a job on CUDA, NCCL's all-reduce pinned to the ring algorithm and the simple protocol
  (``collective_environment``), set before the process group exists: NCCL otherwise chooses
  among ring, tree and NVLink SHARP by message size and topology, and NVLS is not repeatable from
  one call to the next.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from typing import Literal

import torch

log = logging.getLogger(__name__)

Deterministic = Literal["auto", "on", "off"]

CUBLAS_WORKSPACE = ":4096:8"

#: Inductor reads it when its config is first imported, and its compile workers inherit it.
INDUCTOR_ENV = "TORCHINDUCTOR_DETERMINISTIC"

#: What NCCL must use for its sums to follow one order: the ring (whose order is fixed by the
#: ranks' places in it) in the simple protocol (whose chunking is fixed by the message size).
NCCL_PINNED = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


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
    # Read only while the mode is on; off, so that no allocation pays a fill kernel.
    # A module attribute torch sets at run time; its stubs do not declare it.
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    _inductor(on)


def _inductor(on: bool) -> None:
    """Inductor's switch follows the mode; off, it goes back to what the operator's environment
    says. Its config is imported only if it is not already (use_deterministic_algorithms(True)
    imports it): off, with no compile yet, there is nothing to switch."""
    if on:
        os.environ.setdefault(INDUCTOR_ENV, "1")
    if on or "torch._inductor.config" in sys.modules:
        import torch._inductor.config as inductor_config

        inductor_config.deterministic = on or os.environ.get(INDUCTOR_ENV) == "1"


def collective_environment(on: bool, device: torch.device) -> dict[str, str]:
    """The NCCL settings the mode needs on `device`: none off CUDA or with the mode off."""
    return dict(NCCL_PINNED) if on and device.type == "cuda" else {}


def pin_collectives(on: bool, device: torch.device) -> None:
    """Set `collective_environment` before the process group is created (NCCL reads it when
    the communicator is made); a value the operator set is kept, and named in the log."""
    for name, value in collective_environment(on, device).items():
        if (current := os.environ.setdefault(name, value)) != value:
            log.warning(
                "%s=%s set by the operator (the deterministic mode uses %s): a job's sums may "
                "not repeat bit for bit",
                name,
                current,
                value,
            )


#: Benchmarks only (scripts/gpu_check.py compares attention kernels): the SDPA backends a CUDA
#: step may use, by name (e.g. "MATH" or "FLASH_ATTENTION"). Not recorded in a manifest: a run
#: trained under it is a measurement, not a run to resume.
BENCH_BACKENDS_ENV = "ANDREA_BENCH_SDPA_BACKENDS"


@functools.cache
def forced_backends(value: str) -> list:
    """The SDPA backends named in `value` (BENCH_BACKENDS_ENV's comma-separated names). SDPBackend
    is a pybind enum: its members are attributes, it cannot be subscripted."""
    from torch.nn.attention import SDPBackend

    names = [name.strip().upper() for name in value.split(",") if name.strip()]
    known = [n for n in dir(SDPBackend) if not n.startswith("_") and n.isupper()]
    unknown = [n for n in names if n not in known] if names else [repr(value)]
    if unknown:
        raise ValueError(
            f"{BENCH_BACKENDS_ENV}={value!r}: not SDPA backend names: {', '.join(unknown)} "
            f"(known: {', '.join(known)})"
        )
    return [getattr(SDPBackend, n) for n in names]


def attention(on: bool, device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The context the forward and backward passes run in: on CUDA with the mode on, the
    attention backends whose backward is deterministic under it (flash, memory-efficient, math);
    cuDNN's is not, and is left out explicitly as torch itself does. Backends forced by
    BENCH_BACKENDS_ENV apply on every device, so that a CPU dry run goes through this path."""
    if forced := os.environ.get(BENCH_BACKENDS_ENV):
        from torch.nn.attention import sdpa_kernel

        return sdpa_kernel(forced_backends(forced))
    if device.type != "cuda" or not on:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )
