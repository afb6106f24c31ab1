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
from pydantic import BaseModel, ConfigDict, field_validator

#: Sizes of the generators' states, checked when a manifest is read so that a damaged RNG state
#: makes the checkpoint damaged (skipped with its reason) instead of failing after the resume began.
_MT_WORDS = 624
_TORCH_CPU_STATE_BYTES = 5056


class RngState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    python: list
    numpy_global: dict
    torch_cpu: str  # base64 of torch.get_rng_state()
    torch_cuda: list[str]  # base64 per device, empty without CUDA

    @field_validator("python")
    @classmethod
    def _python_state(cls, v: list) -> list:
        if (
            len(v) != 3
            or not isinstance(v[1], list)
            or len(v[1]) != _MT_WORDS + 1
            or not all(isinstance(x, int) for x in v[1])
        ):
            raise ValueError("not a Python random state (version, 625 words, gauss)")
        return v

    @field_validator("numpy_global")
    @classmethod
    def _numpy_state(cls, v: dict) -> dict:
        key = v.get("state", {}).get("key")
        if (
            v.get("bit_generator") != "MT19937"
            or not isinstance(key, list)
            or len(key) != _MT_WORDS
        ):
            raise ValueError("not a NumPy MT19937 state of 624 words")
        return v

    @field_validator("torch_cpu")
    @classmethod
    def _torch_state(cls, v: str) -> str:
        try:
            n = len(base64.b64decode(v, validate=True))
        except ValueError:
            raise ValueError("torch CPU RNG state is not base64") from None
        if n != _TORCH_CPU_STATE_BYTES:
            raise ValueError(f"torch CPU RNG state is {n} bytes, expected {_TORCH_CPU_STATE_BYTES}")
        return v


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture() -> RngState:
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    np_state = {
        **np_state,
        "state": {
            k: (v.tolist() if isinstance(v, np.ndarray) else v)
            for k, v in np_state["state"].items()
        },
    }
    cuda = [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []
    return RngState(
        python=[version, list(internal), gauss],
        numpy_global=np_state,
        torch_cpu=_b64(torch.get_rng_state()),
        torch_cuda=cuda,
    )


def restore(state: RngState) -> None:
    """Restore all generators. Raises if the saved CUDA states do not match this machine's devices."""
    n_dev = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if state.torch_cuda and len(state.torch_cuda) != n_dev:
        raise RuntimeError(
            f"checkpoint has RNG states for {len(state.torch_cuda)} CUDA devices, this machine has {n_dev}"
        )
    version, internal, gauss = state.python
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state.numpy_global)
    np_state["state"] = {
        k: (np.asarray(v, dtype=np.uint32) if k == "key" else v)
        for k, v in np_state["state"].items()
    }
    np.random.set_state(np_state)
    torch.set_rng_state(_unb64(state.torch_cpu))
    if state.torch_cuda:
        torch.cuda.set_rng_state_all([_unb64(s) for s in state.torch_cuda])
