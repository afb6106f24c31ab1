"""What the manifest records about the GPU a process trains on, so that a resume on other hardware
or another software stack is announced as not bit-exact (kernels, and so low bits, differ between
GPU models, drivers, CUDA, cuDNN and NCCL versions)."""

from __future__ import annotations

from pathlib import Path

import torch

#: The loaded NVIDIA kernel module describes itself here, without nvidia-smi or NVML.
DRIVER_FILE = Path("/proc/driver/nvidia/version")


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (e.g. 550.54.15), None when it cannot be read."""
    try:
        text = DRIVER_FILE.read_text()
    except OSError:
        return None
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return word
    return None


def describe(device: torch.device) -> dict[str, str | None]:
    """The manifest's GPU fields for `device`; all None on a CPU device."""
    if device.type != "cuda":
        return {
            "gpu": None,
            "compute_capability": None,
            "cuda_driver": None,
            "cuda_runtime": None,
            "cudnn": None,
            "nccl": None,
        }
    major, minor = torch.cuda.get_device_capability(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
    except (AttributeError, RuntimeError):
        nccl = None
    return {
        "gpu": torch.cuda.get_device_name(device),
        "compute_capability": f"{major}.{minor}",
        "cuda_driver": driver_version(),
        "cuda_runtime": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn is not None else None,
        "nccl": nccl,
    }
