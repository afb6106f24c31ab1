"""The run's tokenizer: bytes by default (every existing run unchanged), or a tokenizer.json whose
sha256 is part of the data identity; the vocabulary it implies; decoding that never fails."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from andrea.daemon.config import build_config
from andrea.daemon.data.open_settings import resolve_open_settings
from andrea.daemon.data.tokenizer import (
    BYTES,
    ByteTokenizer,
    TokenizerError,
    load_tokenizer,
    padded_vocab,
    tokenizer_identity,
)
from tests.support.owndata import PROSE, bpe_file


@pytest.fixture
def bpe(tmp_path: Path) -> Path:
    return bpe_file(tmp_path / "tokenizer.json", [PROSE * 20, "def f(x):\n    return x\n" * 20])


def test_bytes_is_the_default_and_keeps_every_existing_hash() -> None:
    cfg = build_config()
    assert cfg.data.tokenizer == BYTES
    # The hash of a run created before tokenizers existed (pinned in test_heldout too), and of a
    # new run with a split and a text and tokens arm, as the previous version computed them.
    assert cfg.trajectory_hash() == (
        "9da9219e4f563267841399c3d70c439c7c662958748364d9efc7d9a3c2dd8a35"
    )
    arms = [
        {"name": "n", "kind": "text", "paths": ["a/*.txt"]},
        {"name": "t", "kind": "tokens", "path": "x.u16", "dtype": "uint16"},
    ]
    split = build_config({"data": {"heldout_fraction": 0.05, "arms": arms}})
    assert split.trajectory_hash() == (
        "d0cbc46ab1d123fd94ca94a97cc977332144395473062fe8e09864e71f1067a8"
    )
    subword = build_config(
        {"data": {"heldout_fraction": 0.05, "arms": arms, "tokenizer": "t.json"}}
    )
    assert subword.trajectory_hash() != split.trajectory_hash()


def test_byte_tokenizer_round_trips_and_never_fails_to_decode() -> None:
    tok = ByteTokenizer()
    assert tok.encode("déf ") == list("déf ".encode())
    assert tok.decode(tok.encode("déf ")) == "déf "
    # Ids a byte cannot be (a vocabulary above 256) decode as U+FFFD instead of raising.
    assert tok.decode([100, 300, 101, 50303]) == "d\ufffde\ufffd"
    assert tok.separator.tolist() == [10, 10]
    assert (tok.n_vocab, tok.suffix) == (256, "u8")


def test_file_tokenizer_identity_size_and_decoding(bpe: Path) -> None:
    tok = load_tokenizer("tokenizer.json", bpe.parent)
    assert tok.identity == hashlib.sha256(bpe.read_bytes()).hexdigest()
    assert tokenizer_identity("tokenizer.json", bpe.parent) == tok.identity
    assert tok.n_vocab == 300 and tok.suffix == "u16"
    ids = tok.encode("The trainer reads the documents")
    assert len(ids) < len("The trainer reads the documents")
    assert tok.decode(ids) == "The trainer reads the documents"
    # The rows a vocabulary is padded with (300 → 320) and any id beyond: U+FFFD, never an error.
    assert tok.decode([*ids[:2], 310, 10**6]) == tok.decode(ids[:2]) + "\ufffd\ufffd"


def test_vocab_defaults_to_the_tokenizer_rounded_up_and_a_smaller_one_is_refused(
    bpe: Path,
) -> None:
    cfg = build_config({"data": {"tokenizer": "tokenizer.json"}})
    assert resolve_open_settings(cfg, bpe.parent, predates_splits=False).cfg.model.vocab_size == 320
    assert resolve_open_settings(build_config(), bpe.parent, False).cfg.model.vocab_size == 256
    assert (padded_vocab(50257), padded_vocab(256), padded_vocab(257)) == (50304, 256, 320)
    explicit = build_config({"data": {"tokenizer": "tokenizer.json"}, "model": {"vocab_size": 299}})
    with pytest.raises(TokenizerError) as e:
        resolve_open_settings(explicit, bpe.parent, False)
    assert "[model] vocab_size 299" in str(e.value) and "300 ids" in str(e.value)
    assert "[data] tokenizer = 'tokenizer.json'" in str(e.value)
    bigger = build_config({"data": {"tokenizer": "tokenizer.json"}, "model": {"vocab_size": 512}})
    assert resolve_open_settings(bigger, bpe.parent, False).cfg.model.vocab_size == 512


def test_an_unusable_tokenizer_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=r"tokenizer = 'none.json'.*does not exist"):
        load_tokenizer("none.json", tmp_path)
    (tmp_path / "bad.json").write_text("{not a tokenizer")
    with pytest.raises(TokenizerError, match="not a tokenizers file"):
        load_tokenizer("bad.json", tmp_path)
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(TokenizerError, match="not a regular file"):
        load_tokenizer("dir.json", tmp_path)


def test_held_out_case_of_a_new_run_and_of_a_run_older_than_splits(tmp_path: Path) -> None:
    new = resolve_open_settings(build_config(), tmp_path, predates_splits=False)
    assert new.cfg.data.heldout_fraction == 0.05 and "a new run" in new.heldout
    old = resolve_open_settings(build_config(), tmp_path, predates_splits=True)
    assert old.cfg.data.heldout_fraction is None and "predates held-out splits" in old.heldout
    set_ = resolve_open_settings(build_config({"data": {"heldout_fraction": 0.1}}), tmp_path, True)
    assert set_.cfg.data.heldout_fraction == 0.1


def test_a_new_runs_own_run_toml_records_what_it_leaves_open(tmp_path: Path) -> None:
    from andrea.daemon.config import left_open, load_toml, record_resolved

    path = tmp_path / "run.toml"
    text = '# mine\npreset = "andrea-tiny"\nseed = 7\n[data]\ntokenizer = "bytes"\n'
    path.write_text(text)
    cfg = resolve_open_settings(build_config(load_toml(path)), tmp_path, predates_splits=False).cfg
    values, recorded = left_open(load_toml(path), cfg)
    assert values["seed"] == 7 and values["data"]["tokenizer"] == "bytes"  # stated: kept
    assert values["data"]["heldout_fraction"] == 0.05 and values["model"]["vocab_size"] == 256
    assert "data.heldout_fraction = 0.05" in recorded and "optim.*" in recorded
    assert "batch_size_per" not in values  # unset stays unset: what the file left to the reading
    assert build_config(values).trajectory_hash() == cfg.trajectory_hash()
    assert left_open(values, cfg)[1] == []  # nothing left open
    record_resolved(cfg, tmp_path, path)
    assert path.read_text() == text  # the person's file, byte for byte
    resolved = load_toml(tmp_path / ".run.resolved.toml")
    assert build_config(resolved).trajectory_hash() == cfg.trajectory_hash()
    assert (tmp_path / ".run.applied.toml").read_text() == text
