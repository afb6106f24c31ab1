"""Sampling at the edges of its temperature: what the trainer's samples and `andreactl generate`
do with a temperature so small that the logits overflow, and what generate refuses."""

from __future__ import annotations

import pytest
import torch

from andrea.control.generate import GenerateError, Sampling
from andrea.daemon.model import next_token


def test_a_vanishing_temperature_is_greedy_not_a_failed_draw() -> None:
    logits = torch.tensor([[0.5, 3.0, -1.0], [2.0, 0.0, 1.0]])
    generator = torch.Generator().manual_seed(0)
    # 1e-300: the logits over it are inf, their softmax NaN, and torch.multinomial raised.
    picked = next_token(logits, generator, temperature=1e-300)
    assert picked.tolist() == [[1], [0]]
    assert next_token(logits, generator, temperature=0).tolist() == [[1], [0]]


@pytest.mark.parametrize("temperature", [float("nan"), -0.5, 101.0, float("inf")])
def test_generate_refuses_a_temperature_it_cannot_sample_at(temperature: float) -> None:
    with pytest.raises(GenerateError, match="--temperature"):
        Sampling(temperature=temperature).check()
