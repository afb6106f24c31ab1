"""The token files people bring, as nanoGPT's prepare scripts and llm.c write them, each trained
as written with real processes: a character-level train.bin, val.bin and meta.pkl (exact token
counts, val.bin held out, a bit-exact resume, samples, `generate` and the Hugging Face export
decoding characters); GPT-2-style uint16 files of a 50,257-id tokenizer and llm.c's header files
beside them (exact counts; an undeclared train.bin refused by `--check`; a record written by
`andreactl tokenizer record`; the export saying which arm's tokenizer is unknown)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from andrea.daemon.data.corpus import stdlib_root
from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import andreactl, run_trainer
from tests.support.owndata import gpt2_sized_tokenizer, llmc_file, nanogpt_char, nanogpt_gpt2

SMALL = """\
batch_size = 4

[model]
block_size = 32
n_layer = 1
n_head = 2
n_embd = 16
"""
CHAR_TOML = (
    SMALL
    + """
[data]
tokenizer = "data/shakespeare_char/meta.pkl"

[[data.arms]]
name = "shakespeare"
kind = "tokens"
path = "data/shakespeare_char/train.bin"
heldout_path = "data/shakespeare_char/val.bin"
"""
)
STEPS = 30


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-4000:]
    return res.stdout


def _char_run(run: Path, text: str) -> dict:
    meta = nanogpt_char(run / "data" / "shakespeare_char", text)
    (run / "run.toml").write_text(CHAR_TOML)
    return meta


def test_nanogpt_char_level_files_train_resume_and_decode_as_characters(
    tmp_path: Path, cache_dir: Path
) -> None:
    text = (stdlib_root() / "this.py").read_text() * 3 + (stdlib_root() / "textwrap.py").read_text()
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    meta = _char_run(whole, text)
    common = ("--checkpoint-every", "15", "--sample-every", str(STEPS), "--eval-every", "15")
    res = run_trainer(whole, cache_dir, "--max-steps", str(STEPS), *common)
    log = res.stderr
    assert res.returncode == 0, log[-4000:]
    n_train = int(len(text) * 0.9)
    # Every token counted once (uint16, per the meta.pkl), val.bin held out whole.
    assert (
        f"arm shakespeare: {n_train:,} training tokens, {len(text) - n_train:,} held out from its "
        "own file data/shakespeare_char/val.bin" in log
    ), log[-4000:]
    assert "is unknown" not in log and "meta.pkl" in log, log[-4000:]
    # Resumed from step 15 (the newest checkpoint once step 30's is gone): bit for bit.
    shutil.copytree(whole, stopped)
    (stopped / bin_name(STEPS)).unlink()
    (stopped / manifest_name(STEPS)).unlink()
    res = _ok(run_trainer(stopped, cache_dir, "--max-steps", str(STEPS), *common))
    assert (whole / bin_name(STEPS)).read_bytes() == (stopped / bin_name(STEPS)).read_bytes()
    chars = set(meta["itos"].values())
    (sample,) = re.findall(f"sample at step {STEPS}: (.*)", log)
    sample = ast.literal_eval(sample)  # characters of the vocabulary, not bytes read as such
    assert len(sample) > 60 and set(sample) <= chars, sample
    out = _ok(andreactl(whole, "--json", "generate", "--prompt", "The ", "--max-new-tokens",
                        "40", "--temperature", "0"))  # fmt: skip
    generated = json.loads(out)
    continuation = json.dumps(generated)
    assert "The " in continuation and "\\ufffd" not in continuation, out
    _export_decodes_characters(whole, tmp_path / "hf", meta)


def _export_decodes_characters(run: Path, dest: Path, meta: dict) -> None:
    """The Hugging Face export ships the tokenizer made from meta.pkl, which transformers loads
    and decodes characters with, and says nothing is unknown."""
    report = json.loads(_ok(andreactl(run, "--json", "export", "--to", str(dest), "--format",
                                      "hf", timeout=600)))  # fmt: skip
    assert report["tokenizer"]["kind"] == "file" and report["tokenizer"]["n_vocab"] == len(
        meta["itos"]
    )
    assert "unknown" not in (dest / "README.md").read_text()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dest))
    ids = [meta["stoi"][c] for c in "Beautiful is better than ugly.\n"]
    assert tok.decode(ids) == "Beautiful is better than ugly.\n"
    assert tok("Beautiful")["input_ids"] == ids[:9]


GPT2_TOML = (
    SMALL
    + """
[data]
tokenizer = "gpt2/tokenizer.json"

[[data.arms]]
name = "owt"
kind = "tokens"
path = "data/openwebtext/train.bin"
heldout_path = "data/openwebtext/val.bin"
dtype = "uint16"

[[data.arms]]
name = "llmc"
kind = "tokens"
path = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
heldout_path = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"
"""
)


def test_gpt2_uint16_and_llmc_files_count_exactly_and_the_export_says_what_is_unknown(
    tmp_path: Path, cache_dir: Path
) -> None:
    run = tmp_path / "run"
    rng = np.random.default_rng(0)
    owt = rng.integers(0, 50257, 20_000).tolist()
    nanogpt_gpt2(run / "data" / "openwebtext", owt[:18_000], owt[18_000:])
    llmc = rng.integers(0, 50257, 9_000).tolist()
    ts = run / "dev" / "data" / "tinyshakespeare"
    llmc_file(ts / "tiny_shakespeare_train.bin", llmc[:8_000])
    llmc_file(ts / "tiny_shakespeare_val.bin", llmc[8_000:])
    gpt2_sized_tokenizer(run / "gpt2" / "tokenizer.json")
    (run / "run.toml").write_text(GPT2_TOML.replace('dtype = "uint16"\n', ""))
    # Without dtype, nothing says the type of train.bin's ids: --check refuses it as the start
    # does (tests/unit/test_token_files.py), where it used to pass and train on zero bytes.
    res = run_trainer(run, cache_dir, "--check")
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr[-3000:]
    assert "arm 'owt': nothing says how wide the ids" in res.stderr
    assert 'set dtype = "uint16"' in res.stderr
    (run / "run.toml").write_text(GPT2_TOML)
    res = run_trainer(run, cache_dir, "--max-steps", "10", "--checkpoint-every", "10")
    log = _ok(res) + res.stderr
    assert "arm owt: 18,000 training tokens, 2,000 held out from its own file" in log, log[-3000:]
    assert "arm llmc: 8,000 training tokens, 1,000 held out from its own file" in log
    assert "llm.c header (magic 20240520, version 1)" in log
    assert "model.vocab_size = 50304" in log  # the tokenizer's 50,257, padded as nanoGPT does
    unknown = [line for line in log.splitlines() if "is unknown" in line]
    assert len(unknown) == 2 and all("WARNING" in line for line in unknown), unknown
    # A record written for a file says which tokenizer made it (said once at INFO on later
    # starts, and silenced by a record: tests/unit/test_token_files.py).
    _ok(andreactl(run, "tokenizer", "record", "--input", "data/openwebtext/train.bin",
                  "--dtype", "uint16", cwd=run))  # fmt: skip
    # The export ships the run's tokenizer, and says in its log and README which arm's maker is
    # unknown (M6: it used to ship a byte tokenizer for any ids, silently).
    out = _ok(andreactl(run, "export", "--to", str(tmp_path / "export"), timeout=600))
    assert "WARNING: arm 'llmc': which tokenizer made" in out and "arm 'owt'" not in out, out
    readme = (tmp_path / "export" / "README.md").read_text()
    assert "the tokenizer of some training data is unknown" in readme
