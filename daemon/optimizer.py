"""AdamW: torch's fused AdamW kernel, called without `torch.optim`'s wrapper around it.

`torch.optim.AdamW` imports the compiler (`torch._dynamo`, with sympy) the first time it is built
or stepped: torch wraps its methods to keep `torch.compile` out of them. The import costs about
1.7 s of CPU, a third of every trainer start on the CPU, for a compiler that a run without
`compile` never uses. This class calls the kernel that `torch.optim.AdamW(fused=True)` calls, with
the same state (a float32 step count on the parameter's device, then `exp_avg` and `exp_avg_sq`),
so every weight and moment is bit-identical to it: tests/unit/test_optimizer.py holds the two side
by side, step by step, and through a `state_dict()` round trip.

The surface is the part of `torch.optim.Optimizer` the trainer uses: `param_groups` (whose "lr" the
trainer sets before each step), `state`, `zero_grad()`, `step()`, and `state_dict()` /
`load_state_dict()` in torch's format (state keyed by the parameter's index over the groups).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch

#: The fused kernel: recorded in the manifest's optimizer state.
FUSED = True
#: What torch's AdamW records of each group beyond the hyper-parameters: the variant this class is.
#: In `state_dict()` so that torch's AdamW, given it, runs this variant (absent keys make it fall
#: back to its unfused loop).
_TORCH_VARIANT: dict[str, Any] = {
    "amsgrad": False,
    "maximize": False,
    "foreach": None,
    "capturable": False,
    "differentiable": False,
    "fused": FUSED,
    "decoupled_weight_decay": True,
}
_HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")


class AdamW:
    """AdamW with decoupled weight decay over parameter groups (dicts with "params" and, per
    group, any of "lr", "betas", "eps", "weight_decay")."""

    def __init__(
        self,
        groups: Iterable[dict[str, Any]],
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        self.param_groups: list[dict[str, Any]] = [
            {**defaults, **group, "params": list(group["params"])} for group in groups
        ]
        params = [p for g in self.param_groups for p in g["params"]]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears in more than one group")
        for g in self.param_groups:
            _check_hyperparameters(g)
        #: Per parameter, its state once it has had a step; an empty dict before (as torch's).
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self) -> None:
        """Drop every gradient (set to None, as torch's default), so the next backward writes
        fresh ones."""
        for g in self.param_groups:
            for p in g["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        for g in self.param_groups:
            with_grad = [p for p in g["params"] if p.grad is not None]
            for kind in _by_device_and_dtype(with_grad).values():
                states = [self._state(p) for p in kind]
                grads = [p.grad for p in kind if p.grad is not None]
                steps = [s["step"] for s in states]
                torch._foreach_add_(steps, 1)
                beta1, beta2 = g["betas"]
                torch._fused_adamw_(
                    kind,
                    grads,
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [],
                    steps,
                    amsgrad=False,
                    lr=g["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=g["weight_decay"],
                    eps=g["eps"],
                    maximize=False,
                )

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:
            if p.grad is not None and p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients")
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: "state" keyed by each parameter's index over the groups (the tensors
        themselves, not copies), "param_groups" with those indices in place of the parameters."""
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            ids = [index.setdefault(id(p), len(index)) for p in g["params"]]
            groups.append({**{k: g[k] for k in _HYPERPARAMETERS}, **_TORCH_VARIANT, "params": ids})
        params = [p for g in self.param_groups for p in g["params"]]
        state = {index[id(p)]: dict(self.state[p]) for p in params if self.state.get(p)}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the hyper-parameters and per-parameter state of `state_dict` (as `state_dict()`
        gives, or torch's fused AdamW): the step count as float32 and the moments in the parameter's
        dtype, all on the parameter's device."""
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the saved parameter groups do not match the optimizer's in size")
        by_index = {
            i: p for g, s in zip(self.param_groups, saved) for p, i in zip(g["params"], s["params"])
        }
        if not set(state_dict["state"]) <= set(by_index):
            raise ValueError("the saved state names a parameter the saved groups do not have")
        for g, s in zip(self.param_groups, saved):
            g.update({k: s[k] for k in _HYPERPARAMETERS if k in s})
            _check_hyperparameters(g)
        self.state = defaultdict(dict)
        for i, values in state_dict["state"].items():
            p = by_index[i]
            self.state[p] = {
                k: v.to(dtype=torch.float32 if k == "step" else p.dtype, device=p.device)
                for k, v in values.items()
            }


def _check_hyperparameters(g: dict[str, Any]) -> None:
    beta1, beta2 = g["betas"]
    if not (g["lr"] >= 0 and g["eps"] >= 0 and g["weight_decay"] >= 0):
        raise ValueError(
            f"AdamW needs lr, eps and weight_decay >= 0: {g['lr']}, {g['eps']}, {g['weight_decay']}"
        )
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        raise ValueError(f"AdamW needs betas in [0, 1): {g['betas']}")


def _by_device_and_dtype(
    params: list[torch.Tensor],
) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    # One kernel call takes tensors of one device and dtype, as in torch's own grouping.
    kinds: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p in params:
        kinds.setdefault((p.device, p.dtype), []).append(p)
    return kinds
