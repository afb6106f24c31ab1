"""Sampling at the edges of its settings: what the trainer's samples and `andreactl generate` do
with a temperature so small that the logits overflow or a top-p that rounds to 0, and what
generate refuses (a seed, length or device out of range, a prompt that encodes to nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from andrea.control.commands.conventions import UserError
from andrea.control.commands.generate import _encode
from andrea.control.generate import MAX_NEW_TOKENS, GenerateError, Sampling, torch_device
from andrea.daemon.data.tokenizer import FileTokenizer
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


def test_a_top_p_that_rounds_to_zero_keeps_the_most_likely_token() -> None:
    # 1e-46 is 0 in the logits' float32: every token was dropped and the draw raised.
    logits = torch.tensor([[0.5, 3.0, -1.0]])
    for top_p in (1e-46, 5e-324):
        picked = next_token(logits, torch.Generator().manual_seed(0), 1.0, top_p=top_p)
        assert picked.tolist() == [[1]]


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"seed": -1}, "--seed -1: must be from 0 to 2**63 - 1"),
        ({"seed": 2**64}, "--seed 18446744073709551616: must be from 0 to 2**63 - 1"),
        ({"seed": 2**63}, "--seed 9223372036854775808"),
        ({"max_new_tokens": 10**12}, "--max-new-tokens 1000000000000: must be from 0 to 65,536"),
        ({"max_new_tokens": -1}, "--max-new-tokens -1"),
    ],
)
def test_generate_refuses_a_seed_or_length_out_of_range(settings: dict, said: str) -> None:
    with pytest.raises(GenerateError) as err:
        Sampling(**settings).check()
    assert said in str(err.value)
    Sampling(seed=2**63 - 1, max_new_tokens=MAX_NEW_TOKENS).check()  # the bounds themselves pass


@pytest.mark.parametrize(
    ("device", "said"),
    [
        ("meta", "--device meta: a model generates on cpu or cuda, not meta"),
        ("bogus", "--device bogus: not a torch device"),
        pytest.param(
            "cuda",
            "--device cuda: this machine has no CUDA device torch can use",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
        ("cuda:4096", "--device cuda:4096: this machine has"),
    ],
)
def test_generate_refuses_a_device_it_cannot_run_on(device: str, said: str) -> None:
    with pytest.raises(GenerateError) as err:
        torch_device(device)
    assert said in str(err.value)
    assert torch_device("cpu") == torch.device("cpu")


def test_a_prompt_the_tokenizer_makes_nothing_of_is_a_usage_error(tmp_path: Path) -> None:
    """A tokenizer that drops whitespace (a word-level one, as many users' are) given " "."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "def": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    raw = tok.to_str().encode()
    path = tmp_path / "words.json"
    path.write_bytes(raw)
    words = FileTokenizer("words.json", path, raw)
    assert words.encode("def ") == [1]
    with pytest.raises(UserError, match=r"prompt 2 \(3 characters\) encodes to no token with"):
        _encode(words, 2, "   ")
