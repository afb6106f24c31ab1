"""Activation recompute (`[model] recompute = "blocks"`): the same bits as without it, dropout
included, and a setting that changes no trajectory (so it may change at any restart). The resume
half, with real processes and SIGTERM: tests/process/test_recompute_resume.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from andrea.daemon import model as model_module
from andrea.daemon.checkpoint.source import shape_differences
from andrea.daemon.config import ModelConfig, build_config, config_changes
from andrea.daemon.model import GPT
from andrea.daemon.trainer.platform import determinism

TINY = {"block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64, "dropout": 0.1}


def _train(
    recompute: str, steps: int = 2, batch: int = 4, device: str = "cpu", bf16: bool = False
) -> tuple[list[float], list[Any]]:
    """`steps` AdamW steps of a tiny GPT with dropout from one seed: each step's loss, then the
    gradients of the last step and the final weights and random states."""
    torch.manual_seed(7)
    gpt = GPT(ModelConfig(**TINY, recompute=recompute)).to(device).train()
    opt = torch.optim.AdamW(gpt.decay_groups(0.1), lr=1e-3)
    data = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 256, (batch, TINY["block_size"] + 1), generator=data).to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, torch.bfloat16, enabled=bf16):
            _, loss = gpt(x[:, :-1], x[:, 1:])
        assert loss is not None
        loss.backward()
        losses.append(loss.item())
        grads = [p.grad.clone() for p in gpt.parameters() if p.grad is not None]
        opt.step()
    states = [torch.get_rng_state()]
    if device == "cuda":
        states.append(torch.cuda.get_rng_state())
    return losses, [*grads, *(p.detach().clone() for p in gpt.parameters()), *states]


def _identical(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_recompute_trains_the_same_bits_with_dropout_on_cpu() -> None:
    plain_losses, plain = _train("none")
    losses, state = _train("blocks")
    assert [x.hex() for x in losses] == [x.hex() for x in plain_losses]
    # Gradients of the last step, weights after the second, and torch's random state afterwards
    # (the recompute's draws are put back, so the next step draws what it would have).
    assert _identical(state, plain)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_recompute_trains_the_same_bits_with_dropout_on_cuda(bf16: bool) -> None:
    """Eager, in the deterministic mode (the trainer's on CUDA): the GPU's generator is restored
    for the recompute too, so its dropout masks are the forward's. (scripts/gpu_check.py runs it.)"""
    determinism.apply(True)
    try:
        plain_losses, plain = _train("none", device="cuda", bf16=bf16)
        losses, state = _train("blocks", device="cuda", bf16=bf16)
    finally:
        determinism.apply(False)
    assert [x.hex() for x in losses] == [x.hex() for x in plain_losses]
    assert _identical([t.cpu() for t in state], [t.cpu() for t in plain])


def test_recompute_runs_each_block_again_in_the_backward_pass(monkeypatch) -> None:
    calls = []
    compute = model_module.Block._compute

    def counted(self: model_module.Block, x: torch.Tensor) -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        return compute(self, x)

    monkeypatch.setattr(model_module.Block, "_compute", counted)
    _train("blocks", steps=1)
    assert len(calls) == 2 * TINY["n_layer"]  # forward, then again in the backward pass
    calls.clear()
    _train("none", steps=1)
    assert len(calls) == TINY["n_layer"]
    calls.clear()
    with torch.no_grad():  # evaluation and sampling keep nothing to recompute
        GPT(ModelConfig(**TINY, recompute="blocks")).train()(torch.zeros(1, 8, dtype=torch.long))
    assert len(calls) == TINY["n_layer"]


def test_without_the_random_state_the_recompute_would_draw_other_masks(monkeypatch) -> None:
    # The control: what the bit-for-bit test above would see if the recompute did not restore
    # torch's random state (its dropout masks then differ from the forward pass's).
    real: Callable[..., Any] = model_module.checkpoint

    def forgetful(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return real(fn, *args, **{**kwargs, "preserve_rng_state": False})

    _, plain = _train("none", steps=1)
    monkeypatch.setattr(model_module, "checkpoint", forgetful)
    _, state = _train("blocks", steps=1)
    assert not _identical(state, plain)


def test_recompute_changes_no_trajectory_and_no_shape() -> None:
    plain = build_config(overrides={"preset": "andrea-tiny"})
    on = build_config(overrides={"preset": "andrea-tiny", "model": {"recompute": "blocks"}})
    assert on.model.recompute == "blocks" and plain.model.recompute == "none"
    assert on.trajectory_hash() == plain.trajectory_hash()
    assert config_changes(plain.trajectory(), on.trajectory()) == []
    assert shape_differences(plain.model, on.model) == []
    assert on.model.arithmetic() == plain.model
    # Left out of a dump at its default, so that run.toml and the manifests read as before.
    assert "recompute" not in plain.model.model_dump(mode="json")
    assert on.model.model_dump(mode="json")["recompute"] == "blocks"
    with pytest.raises(ValueError, match="recompute"):
        build_config(overrides={"model": {"recompute": "all"}})
