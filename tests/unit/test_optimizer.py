"""The trainer's AdamW (daemon/optimizer.py) against torch's own `torch.optim.AdamW(fused=True)`:
the same weights, moments and step counts, bit for bit, step after step, with the trainer's
per-step learning rate, gradient clipping and two weight-decay groups; and through a state_dict
round trip in either direction, so a run resumed from either continues the same."""

from __future__ import annotations

import copy

import pytest
import torch

from andrea.daemon.config import ModelConfig
from andrea.daemon.model import GPT
from andrea.daemon.optimizer import AdamW

MODEL = ModelConfig(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
HYPER = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8}


def _gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(MODEL)


def _train(model: GPT, opt: AdamW | torch.optim.AdamW, steps: range) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(step)
        x = torch.randint(0, MODEL.vocab_size, (4, MODEL.block_size + 1), generator=g)
        for group in opt.param_groups:
            group["lr"] = 3e-3 * (0.5 + (step % 7) / 7)
        opt.zero_grad()
        model(x[:, :-1], x[:, 1:])[1].backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5, foreach=True)
        opt.step()


def _same(a: GPT, oa: AdamW | torch.optim.AdamW, b: GPT, ob: AdamW | torch.optim.AdamW) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
        sa, sb = oa.state[p], ob.state[q]
        assert sorted(sa) == sorted(sb) == ["exp_avg", "exp_avg_sq", "step"], name
        for key in sa:
            assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), (name, key)


def test_every_step_is_torchs_fused_adamw_bit_for_bit() -> None:
    ours, theirs = _gpt(), _gpt()
    o = AdamW(ours.decay_groups(0.1), **HYPER)
    t = torch.optim.AdamW(theirs.decay_groups(0.1), fused=True, **HYPER)  # type: ignore[arg-type]
    for step in range(1, 13):
        _train(ours, o, range(step, step + 1))
        _train(theirs, t, range(step, step + 1))
        _same(ours, o, theirs, t)
    assert not torch.equal(next(ours.parameters()), next(_gpt().parameters())), "it trained"


@pytest.mark.parametrize("source", ["ours", "torch"])
def test_a_state_dict_resumes_the_same_trajectory(source: str) -> None:
    straight = _gpt()
    o = AdamW(straight.decay_groups(0.1), **HYPER)
    _train(straight, o, range(1, 9))

    first = _gpt()
    if source == "ours":
        before: AdamW | torch.optim.AdamW = AdamW(first.decay_groups(0.1), **HYPER)
    else:
        before = torch.optim.AdamW(first.decay_groups(0.1), fused=True, **HYPER)  # type: ignore[arg-type]
    _train(first, before, range(1, 5))
    resumed = _gpt()
    resumed.load_state_dict(first.state_dict())
    after = AdamW(resumed.decay_groups(0.0), lr=1.0)
    after.load_state_dict(before.state_dict())
    assert [g["weight_decay"] for g in after.param_groups] == [0.1, 0.0], "the groups' settings"
    _train(resumed, after, range(5, 9))
    _same(resumed, after, straight, o)


def test_torchs_adamw_resumes_from_ours() -> None:
    ours, theirs = _gpt(), _gpt()
    o = AdamW(ours.decay_groups(0.1), **HYPER)
    _train(ours, o, range(1, 4))
    theirs.load_state_dict(ours.state_dict())
    t = torch.optim.AdamW(theirs.decay_groups(0.1), fused=True, **HYPER)  # type: ignore[arg-type]
    # A copy: a state_dict holds the optimizer's own tensors (as torch's), and both train on.
    t.load_state_dict(copy.deepcopy(o.state_dict()))
    _train(ours, o, range(4, 7))
    _train(theirs, t, range(4, 7))
    _same(ours, o, theirs, t)


def test_bad_settings_and_mismatched_states_are_refused() -> None:
    gpt = _gpt()
    with pytest.raises(ValueError, match="betas"):
        AdamW(gpt.decay_groups(0.1), lr=1e-3, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="lr, eps and weight_decay"):
        AdamW(gpt.decay_groups(0.1), lr=-1e-3)
    with pytest.raises(ValueError, match="more than one group"):
        AdamW([{"params": list(gpt.parameters())}] * 2, lr=1e-3)
    o = AdamW(gpt.decay_groups(0.1), lr=1e-3)
    one_group = AdamW([{"params": list(gpt.parameters())}], lr=1e-3)
    with pytest.raises(ValueError, match="do not match"):
        o.load_state_dict(one_group.state_dict())
    assert o.state_dict()["state"] == {}, "nothing was taken from a refused state"
