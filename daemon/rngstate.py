"""Capture and restore every random number generator that can affect training, as plain JSON.

Python's `random`, NumPy's global state, torch's CPU generator and every CUDA device's generator
are all saved, even those the trainer does not draw from itself today: a library that does (a
data transform, a custom layer) would otherwise make a resume silently inexact. Restoring is
all-or-nothing and failures raise — never "could not load random states" and carry on.
"""

from __future__ import annotations

import base64
import random

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict


class RngState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    python: list
    numpy_global: dict
    torch_cpu: str  # base64 of torch.get_rng_state()
    torch_cuda: list[str]  # base64 per device, empty without CUDA


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture() -> RngState:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    np_state = {**np_state, "state": {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in np_state["state"].items()}}
    cuda = [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
    return RngState(
        python=[version, list(internal), gauss], numpy_global=np_state,
        torch_cpu=_b64(torch.get_rng_state()), torch_cuda=cuda,
    )


def restore(state: RngState) -> None:
    """Restore all generators. Raises if the saved CUDA states do not match this machine's devices."""
    n_dev = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if state.torch_cuda and len(state.torch_cuda) != n_dev:
        raise RuntimeError(f"checkpoint has RNG states for {len(state.torch_cuda)} CUDA devices, this machine has {n_dev}")
    version, internal, gauss = state.python
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state.numpy_global)
    np_state["state"] = {k: (np.asarray(v, dtype=np.uint32) if k == "key" else v) for k, v in np_state["state"].items()}
    np.random.set_state(np_state)
    torch.set_rng_state(_unb64(state.torch_cpu))
    if state.torch_cuda:
        torch.cuda.set_rng_state_all([_unb64(s) for s in state.torch_cuda])
