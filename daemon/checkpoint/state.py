"""The one mapping between live training state and a checkpoint's payload.

The payload stores the weights and AdamW's two moments as three flat float32 arrays in the order
of the manifest's layout (the model's parameter iterator). The trainer's resume and export's load
both go through here, so a checkpoint is read back into tensors in exactly one way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manifest import LayoutEntry
from andrea.daemon.optimizer import AdamW


def _views(flat: np.ndarray, layout: Sequence[LayoutEntry]) -> list[torch.Tensor]:
    arrays = checkpoint_format.unflatten(flat, [(e.name, tuple(e.shape), e.offset) for e in layout])
    # A read-only array (a memory-mapped payload) is copied: torch tensors must be writable.
    return [torch.from_numpy(a if a.flags.writeable else a.copy()) for a in arrays.values()]


def check_layout(
    named_params: Sequence[tuple[str, torch.Tensor]], layout: Sequence[LayoutEntry]
) -> None:
    """Raise ValueError unless the parameters are the layout's, name by name and shape by shape."""
    have = [(name, tuple(p.shape)) for name, p in named_params]
    want = [(e.name, tuple(e.shape)) for e in layout]
    if have != want:
        diff = next(
            (f"{h} != {w}" for h, w in zip(have, want) if h != w), f"{len(have)} != {len(want)}"
        )
        raise ValueError(f"the model's parameters do not match the checkpoint's layout: {diff}")


def load_weights(
    named_params: Sequence[tuple[str, torch.Tensor]],
    layout: Sequence[LayoutEntry],
    weights: np.ndarray,
) -> None:
    """Copy the payload's flat weights into the parameters, in place."""
    check_layout(named_params, layout)
    with torch.no_grad():
        for (_, param), tensor in zip(named_params, _views(weights, layout)):
            param.copy_(tensor)


def load_adam_state(
    optimizer: AdamW,
    params: Sequence[torch.Tensor],
    layout: Sequence[LayoutEntry],
    payload: checkpoint_format.Payload,
    adam_step: int,
) -> None:
    """Give AdamW the payload's moments and step count for `params` (in layout order).

    Adam's moments are created lazily on the first step; a resume must create them from the
    checkpoint explicitly, or the first resumed step runs with m = v = 0 (KempnerForge #115).
    The moments are copied: the payload's buffer is reused by the next checkpoint.
    """
    index = {id(q): i for i, q in enumerate(q for g in optimizer.param_groups for q in g["params"])}
    state = {}
    for param, m, v in zip(params, _views(payload.m, layout), _views(payload.v, layout)):
        state[index[id(param)]] = {
            "step": torch.tensor(float(adam_step), dtype=torch.float32),
            "exp_avg": m.clone(),
            "exp_avg_sq": v.clone(),
        }
    sd = optimizer.state_dict()
    sd["state"] = state
    optimizer.load_state_dict(sd)
