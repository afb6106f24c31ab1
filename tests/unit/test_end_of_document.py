"""The end of a document: `andreactl tokenizer train` reserves `<|endofdocument|>` (id 0), the
arms' documents are joined by it under such a tokenizer, and every tokenizer without it joins
them as before (a blank line's encoding), under the identities its runs already have."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from andrea.control import andreactl
from andrea.daemon.config import DataConfig
from andrea.daemon.data.arms import load_arms
from andrea.daemon.data.tokenizer import END_OF_DOCUMENT, load_tokenizer
from tests.support.owndata import PROSE, bpe_file, write_jsonl

RUN_TOML = """\
[data]
tokenizer = "tokenizer.json"
heldout_fraction = 0.0

[[data.arms]]
name = "web"
kind = "jsonl"
paths = ["web.jsonl"]
"""
DOCS = [PROSE[: 60 + i] + f" {i}" for i in range(30)] + [f"a literal {END_OF_DOCUMENT} is text"]


def _web(run: Path, tokenizer: str) -> np.ndarray:
    cfg = DataConfig.model_validate(
        {
            "arms": [{"name": "web", "kind": "jsonl", "paths": ["web.jsonl"]}],
            "tokenizer": tokenizer,
            "cache_dir": str(run / "cache"),
            "heldout_fraction": 0.0,
        }
    )
    (arm,) = load_arms(cfg, run, 512)
    return np.asarray(arm.tokens)


def test_a_trained_tokenizer_ends_each_document_with_its_token(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.toml").write_text(RUN_TOML)
    write_jsonl(run / "web.jsonl", [{"text": d} for d in DOCS])
    argv = ["tokenizer", "train", "--run-dir", str(run), "--vocab-size", "400", "--no-cache"]
    assert andreactl.main(argv) == 0
    added = json.loads((run / "tokenizer.json").read_text())["added_tokens"]
    assert [(t["id"], t["content"], t["special"]) for t in added] == [(0, END_OF_DOCUMENT, True)]
    tok = load_tokenizer("tokenizer.json", run)
    assert tok.end_of_document == 0 and tok.separator.tolist() == [0]
    tokens = _web(run, "tokenizer.json")
    # One id between two documents, and nowhere else: the token's text inside a document is text.
    parts = np.split(tokens, np.flatnonzero(tokens == 0))
    assert len(parts) == len(DOCS)
    assert [tok.decode(p[p != 0].tolist()) for p in parts] == DOCS
    assert tok.encode(DOCS[-1]) != tok.encode("a literal ") + [0] + tok.encode(" is text")


def test_a_tokenizer_without_it_joins_with_a_blank_line_as_before(tmp_path: Path) -> None:
    # GPT-2's and StarCoder's tokenizer files carry "<|endoftext|>": runs already use them.
    run = tmp_path / "run"
    bpe_file(run / "plain.json", [PROSE * 10])
    gpt2_like = json.loads((run / "plain.json").read_text())
    top = len(gpt2_like["model"]["vocab"])  # its last id, as GPT-2's 50256
    gpt2_like["added_tokens"] = [
        {"id": top, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
    ]  # fmt: skip
    (run / "gpt2_like.json").write_text(json.dumps(gpt2_like))
    write_jsonl(run / "web.jsonl", [{"text": d} for d in DOCS])
    for name in ("plain.json", "gpt2_like.json"):
        tok = load_tokenizer(name, run)
        assert tok.end_of_document is None
        blank = tok.encode("\n\n")
        assert tok.separator.tolist() == blank
        expected = []
        for i, d in enumerate(DOCS):
            expected += (blank if i else []) + tok.encode(d)
        assert _web(run, name).tolist() == expected


def test_generate_stops_before_the_end_of_a_document() -> None:
    import torch

    from andrea.control.generate import Loaded, Sampling, generate_ids
    from andrea.daemon.config import ModelConfig
    from andrea.daemon.model import GPT

    model = GPT(ModelConfig(vocab_size=64, block_size=16, n_layer=1, n_head=1, n_embd=8)).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()  # every logit 0: greedy takes id 0, the end of a document
    # No manifest: generate_ids reads the model alone.
    loaded = Loaded(model, load_tokenizer("bytes", Path(".")), None, "test", [])
    greedy = Sampling(max_new_tokens=10, temperature=0.0)
    assert generate_ids(loaded, [5, 6], greedy) == [0] * 10
    assert generate_ids(loaded, [5, 6], greedy, stop=0) == []
    assert generate_ids(loaded, [5, 6], greedy, stop=3) == [0] * 10
