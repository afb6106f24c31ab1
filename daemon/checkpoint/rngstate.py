"""Capture and restore every random number generator that can affect training, as plain JSON.

Python's `random`, NumPy's global state, torch's CPU generator and the generator of the CUDA device
in use are all saved, even those the trainer does not draw from itself today: a library that does
(a data transform, a custom layer) would otherwise make a resume silently inexact. Restoring is
all-or-nothing and failures raise — never "could not load random states" and carry on. Every
saved state is checked when the manifest is read, down to trying it on a throwaway generator, so a
state that the generators would refuse makes the checkpoint damaged (skipped with its reason), never
a crash after the resume began. Readers that never restore a state (the proxy's log check, the
held-out split both daemons read from the newest manifest) validate with `SHAPE_ONLY` in the
context: the torch state's size is checked, not torch's own trial, so that they never import torch
(3–4 s of CPU at each start, more than the proxy's whole start-up).

Only the device this process trains on is saved (one entry in `torch_cuda`), never every visible
device: a run moved to a machine with another number of GPUs (or a rank of a job, which sees its
node's GPUs) must resume, not fail at every restart. Manifests written before kept one entry per
visible device; the entry of the device in use is restored from them.
"""

from __future__ import annotations

import base64
import random
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

if TYPE_CHECKING:  # imported where a state is captured, restored or tried
    import torch

#: Sizes of the generators' states, checked when a manifest is read so that a damaged RNG state
#: makes the checkpoint damaged (skipped with its reason) instead of failing after the resume began.
_MT_WORDS = 624
_TORCH_CPU_STATE_BYTES = 5056
_U32 = 2**32 - 1
_PY_RANDOM_VERSION = 3
#: Validation context of a reader that never restores a state: torch's trial is skipped.
SHAPE_ONLY = {"rng_trial": False}


class RngState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    python: list
    numpy_global: dict
    torch_cpu: str  # base64 of torch.get_rng_state()
    torch_cuda: list[str]  # base64 of the generator of the device in use; empty without CUDA
    cuda_device: int | None = None  # that device's index when saved (None: older manifests)

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
        version, internal, gauss = v
        if version != _PY_RANDOM_VERSION:
            raise ValueError(f"Python random state version {version!r}, this Python has 3")
        if not all(0 <= x <= _U32 for x in internal[:-1]) or not 0 <= internal[-1] <= _MT_WORDS:
            raise ValueError("Python random state has a word outside 0..2^32-1 or a bad position")
        if gauss is not None and not isinstance(gauss, float):
            raise ValueError("Python random state: gauss must be null or a number")
        try:  # the generator's own check, on a throwaway instance: never on the live one
            random.Random().setstate((version, tuple(internal), gauss))
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueError(f"Python random state rejected: {e}") from None
        return v

    @field_validator("numpy_global")
    @classmethod
    def _numpy_state(cls, v: dict) -> dict:
        state = v.get("state")
        key = state.get("key") if isinstance(state, dict) else None
        if (
            v.get("bit_generator") != "MT19937"
            or not isinstance(state, dict)
            or not isinstance(key, list)
            or len(key) != _MT_WORDS
        ):
            raise ValueError("not a NumPy MT19937 state of 624 words")
        pos, has_gauss, gauss = state.get("pos"), v.get("has_gauss"), v.get("gauss")
        if set(v) != {"bit_generator", "state", "has_gauss", "gauss"} or set(state) != {
            "key",
            "pos",
        }:
            raise ValueError("NumPy state has missing or unknown fields")
        if not all(type(x) is int and 0 <= x <= _U32 for x in key):
            raise ValueError("NumPy state key has a word outside 0..2^32-1")
        if type(pos) is not int or not 0 <= pos <= _MT_WORDS:
            raise ValueError(f"NumPy state pos {pos!r} is outside 0..624")
        if has_gauss not in (0, 1) or type(has_gauss) is bool or not isinstance(gauss, float):
            raise ValueError("NumPy state: has_gauss must be 0 or 1 and gauss a number")
        try:
            np.random.RandomState().set_state(_numpy_arrays(v))
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueError(f"NumPy state rejected: {e}") from None
        return v

    @field_validator("torch_cpu")
    @classmethod
    def _torch_state(cls, v: str, info: ValidationInfo) -> str:
        try:
            raw = base64.b64decode(v, validate=True)
        except ValueError:
            raise ValueError("torch CPU RNG state is not base64") from None
        if len(raw) != _TORCH_CPU_STATE_BYTES:
            raise ValueError(
                f"torch CPU RNG state is {len(raw)} bytes, expected {_TORCH_CPU_STATE_BYTES}"
            )
        if info.context is not None and info.context.get("rng_trial") is False:
            return v
        import torch

        try:
            torch.Generator().set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        except RuntimeError as e:
            raise ValueError(f"torch CPU RNG state rejected: {e}") from None
        return v

    @field_validator("torch_cuda")
    @classmethod
    def _cuda_states(cls, v: list[str]) -> list[str]:
        for i, s in enumerate(v):
            try:
                base64.b64decode(s, validate=True)
            except ValueError:
                raise ValueError(f"CUDA RNG state of device {i} is not base64") from None
        return v


def _numpy_arrays(state: dict) -> dict:
    out = dict(state)
    out["state"] = {
        k: (np.asarray(x, dtype=np.uint32) if k == "key" else x) for k, x in state["state"].items()
    }
    return out


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture(device: torch.device | None = None) -> RngState:
    """The state of every generator; on CUDA, of `device`'s generator only (default: current)."""
    import torch

    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    np_state = {
        **np_state,
        "state": {
            k: (v.tolist() if isinstance(v, np.ndarray) else v)
            for k, v in np_state["state"].items()
        },
    }
    cuda, index = [], None
    if (device is not None and device.type == "cuda") or (device is None and _cuda_initialised()):
        index = device.index if device is not None else None
        index = torch.cuda.current_device() if index is None else index
        cuda = [_b64(torch.cuda.get_rng_state(index))]
    return RngState(
        python=[version, list(internal), gauss],
        numpy_global=np_state,
        torch_cpu=_b64(torch.get_rng_state()),
        torch_cuda=cuda,
        cuda_device=index,
    )


def _cuda_initialised() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def restore(state: RngState, device: torch.device | None = None) -> list[str]:
    """Restore all generators; the saved CUDA state goes to `device`, the one this process trains
    on. Returns what could not be restored exactly (a CUDA state without a CUDA device here), for
    the caller to announce with the other reasons a resume is not bit-exact."""
    import torch

    notes = []
    cuda_state = None
    here: torch.device | None = None
    if state.torch_cuda:
        here = device if device is not None and device.type == "cuda" else None
        if here is None:
            notes.append(
                f"the checkpoint holds a CUDA generator state (device {state.cuda_device}) but this "
                "process trains on the CPU; it was not restored"
            )
        elif len(state.torch_cuda) == 1:
            cuda_state = state.torch_cuda[0]
        else:
            # An older manifest: one state per visible device. The process trained on the current
            # device, which is the first unless CUDA_VISIBLE_DEVICES or a rank chose another.
            index = here.index or 0
            if index >= len(state.torch_cuda):
                index = 0
                notes.append(
                    f"the checkpoint holds CUDA generator states for {len(state.torch_cuda)} devices "
                    f"and none for device {here.index}; device 0's was restored"
                )
            cuda_state = state.torch_cuda[index]
    version, internal, gauss = state.python
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(_numpy_arrays(state.numpy_global))
    torch.set_rng_state(_unb64(state.torch_cpu))
    if cuda_state is not None and here is not None:
        torch.cuda.set_rng_state(_unb64(cuda_state), here)
    return notes
