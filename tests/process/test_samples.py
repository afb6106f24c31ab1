"""The trainer's samples (`[samples]` in run.toml) under a subword tokenizer trained by
`andreactl tokenizer train`: default prompts that leave no double space where they end, and
sampling that never changes a bit of training, against a run whose run.toml predates `[samples]`,
stopped and resumed on the way."""

from __future__ import annotations

import ast
import json
import random
import re
import shutil
from pathlib import Path

import pytest

from andrea.daemon.data.heldout import is_held_out
from andrea.daemon.data.tokenizer import load_tokenizer
from tests.support.daemons import andreactl, run_trainer

#: Two arms of prose, each a folder of documents named relative to the run directory.
ARMS = {
    "notes": "the trainer writes a checkpoint at every boundary and the proxy keeps its log while "
    "each arm is read in order by its cursor so that a resume continues exactly",
    "letters": "dear reader we hope this letter finds you well and that the weather where you live "
    "has been kind to your garden and to the long walks you take",
}

DATA_TOML = """\
[data]
tokenizer = "tokenizer.json"
heldout_fraction = 0.25
""" + "".join(
    f'\n[[data.arms]]\nname = "{arm}"\nkind = "text"\npaths = ["{arm}/*.txt"]\n' for arm in ARMS
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """The two arms' documents and a subword (BPE) tokenizer.json trained on them with the
    project's own `andreactl tokenizer train`: a run directory to copy."""
    run = tmp_path_factory.mktemp("corpus")
    rng = random.Random(34)
    for arm, words in ARMS.items():
        (run / arm).mkdir()
        vocabulary = words.split()
        for i in range(30):
            sentences = [
                " ".join(rng.choice(vocabulary) for _ in range(rng.randint(5, 14))).capitalize()
                for _ in range(40)
            ]
            (run / arm / f"{arm}-{i:02d}.txt").write_text(". ".join(sentences) + ".\n")
    (run / "run.toml").write_text(DATA_TOML)
    res = andreactl(
        run, "tokenizer", "train", "--vocab-size", "300", "--cache-dir", str(cache_dir), timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return run


def _run_dir(root: Path, corpus: Path, toml: str) -> Path:
    shutil.copytree(corpus, root)
    (root / "run.toml").write_text(toml + DATA_TOML)
    return root


def _train(run: Path, cache: Path, *extra: str) -> str:
    res = run_trainer(run, cache, *extra, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stderr


def _losses(run: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in json.loads((run / ".loss.json").read_text())}


#: A repr'd string in a log line.
_REPR = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


@pytest.fixture(scope="module")
def sampled(corpus: Path, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path):
    """12 steps sampling every 2 (hot, top-k) from the default prompts: the run and its log."""
    run = _run_dir(
        tmp_path_factory.mktemp("sampled") / "run",
        corpus,
        "[samples]\nevery = 2\nmax_new_tokens = 16\ntemperature = 1.3\ntop_k = 20\n",
    )
    return run, _train(run, cache_dir, "--max-steps", "12", "--sample-every", "2")


def test_default_prompts_leave_no_double_space_under_a_subword_tokenizer(
    corpus: Path, sampled: tuple[Path, str]
) -> None:
    tok = load_tokenizer(str(corpus / "tokenizer.json"), corpus)
    # Why a typed prompt is not neutral here: "The " ends in a lone space token, whose
    # continuation (a word with its own leading space) then gives "The  be".
    assert tok.decode(tok.encode("The ")[-1:]) == " "

    _, log = sampled
    line = re.search(r"samples continue the first 8 tokens of each arm's held-out data: (.*)", log)
    assert line, log[-3000:]
    prompts = [ast.literal_eval(p) for p in _REPR.findall(line.group(1))]
    texts = [ast.literal_eval(t) for t in re.findall(r"sample at step \d+: (.*)", log)]
    assert len(prompts) == 2 and len(texts) == 2 * 6, log[-3000:]
    for prompt, arm in zip(prompts, ARMS, strict=True):
        # The first 8 ids of one of the arm's held-out documents, as the tokenizer encoded it.
        starts = {
            tok.decode(tok.encode(doc.read_text())[:8])
            for doc in (corpus / arm).glob("*.txt")
            if is_held_out(doc.name, 0.25)
        }
        assert prompt in starts, (prompt, starts)
    for i, text in enumerate(texts):
        prompt = prompts[i % 2]
        assert text.startswith(prompt) and len(text) > len(prompt), (prompt, text)
        junction = text[len(prompt) - 1 : len(prompt) + 1]
        assert junction != "  ", f"double space where the prompt {prompt!r} ends: {text!r}"


def test_sampling_changes_no_bit_of_training(
    corpus: Path, sampled: tuple[Path, str], tmp_path: Path, cache_dir: Path
) -> None:
    """Sampling every 2 steps (hot, top-k) against a run.toml from before `[samples]` (its
    settings at the top level, no samples), which is stopped and resumed: the same losses and the
    same checkpoint bytes. andrea-tiny trains with dropout, which draws from torch's generator at
    every step, so a sample drawn from it would change every later step."""
    run, log = sampled
    assert all(f"sample at step {s}: " in log for s in range(2, 13, 2)), log[-3000:]
    old = _run_dir(tmp_path / "old", corpus, "sample_every = 0\nsample_tokens = 16\n")
    _train(old, cache_dir, "--max-steps", "6", "--checkpoint-every", "6")
    _train(old, cache_dir, "--max-steps", "12", "--checkpoint-every", "6")
    assert _losses(run) == _losses(old) and len(_losses(old)) == 12
    name = "step_000012.bin"
    assert (run / name).read_bytes() == (old / name).read_bytes()
    assert "sample_every = 0" in (old / "run.toml").read_text()  # the old file, as it was
