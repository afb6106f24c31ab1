"""Token files as nanoGPT and llm.c write them: the ids' type said by the file (an llm.c header, a
nanoGPT meta.pkl beside it, a record) or the arm, never guessed; val.bin as the held-out data; a
meta.pkl read as plain data only, its vocabulary the run's tokenizer; a warning about a file
said once."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import DataConfig, RunConfig, build_config, trajectory_of
from andrea.daemon.data.arms import DataError, check_tokenizers, load_arms
from andrea.daemon.data.nanogpt_meta import MetaRefused, read_meta
from andrea.daemon.data.sources import SourceRejected
from andrea.daemon.data.token_files import WidthUnknown, record_existing
from andrea.daemon.data.tokenizer import ByteTokenizer, TokenizerError, load_tokenizer
from tests.support.owndata import PROSE, llmc_file, nanogpt_char, nanogpt_gpt2

TEXT = PROSE * 40


def _data(run: Path, arms: list[dict], **extra) -> DataConfig:
    return DataConfig.model_validate(
        {"arms": arms, "cache_dir": str(run / "cache"), "heldout_fraction": 0.05, **extra}
    )


def _tokens(name: str, path: str, **extra) -> dict:
    return {"name": name, "kind": "tokens", "path": path, **extra}


def test_a_nanogpt_train_bin_without_dtype_is_refused_naming_the_arm(tmp_path: Path) -> None:
    """A GPT-2 train.bin (uint16, no meta.pkl) read as uint8 trained on its zero high bytes and
    counted twice its tokens; now nothing says its type, and the arm must."""
    ids = [50256, 464, 3290, 318, 257] * 200
    nanogpt_gpt2(tmp_path / "owt", ids, ids[:100])
    arm = _tokens("owt", "owt/train.bin")
    with pytest.raises(WidthUnknown) as e:
        load_arms(_data(tmp_path, [arm]), tmp_path, 50304)
    assert isinstance(e.value, SourceRejected)  # a config error: exit 2
    assert "arm 'owt'" in str(e.value) and 'set dtype = "uint16"' in str(e.value)
    (a,) = load_arms(_data(tmp_path, [{**arm, "dtype": "uint16"}]), tmp_path, 50304)
    assert a.n_tokens + a.heldout.shape[0] == len(ids)  # spans of train.bin held out
    assert int(np.asarray(a.tokens[np.arange(5)]).max()) == 50256


def test_nanogpt_char_files_train_as_written_with_val_bin_held_out(tmp_path: Path) -> None:
    meta = nanogpt_char(tmp_path / "data" / "sc", TEXT)
    arm = _tokens("sc", "data/sc/train.bin", heldout_path="data/sc/val.bin")
    cfg = _data(tmp_path, [arm], tokenizer="data/sc/meta.pkl")
    tok = load_tokenizer(cfg.tokenizer, tmp_path)
    assert tok.n_vocab == meta["vocab_size"]
    (a,) = load_arms(cfg, tmp_path, 64, tokenizer=tok)
    n_train = int(len(TEXT) * 0.9)
    # The ids' type from the meta.pkl beside it (uint16): every token counted once.
    assert (a.n_tokens, a.heldout.shape[0]) == (n_train, len(TEXT) - n_train)
    assert tok.decode(np.asarray(a.tokens[np.arange(60)]).tolist()) == TEXT[:60]
    assert tok.decode(np.asarray(a.heldout[np.arange(30)]).tolist()) == TEXT[n_train:][:30]
    # The held-out file is part of the identity, and unlike carving spans of train.bin.
    (spans,) = load_arms(_data(tmp_path, [{**arm, "heldout_path": None}], tokenizer=cfg.tokenizer),
                         tmp_path, 64, tokenizer=tok)  # fmt: skip
    assert spans.identity != a.identity and spans.n_tokens + spans.heldout.shape[0] == n_train


def test_the_meta_pkl_tokenizer_encodes_decodes_and_is_made_the_same_each_time(
    tmp_path: Path,
) -> None:
    nanogpt_char(tmp_path / "d", TEXT)
    one = load_tokenizer("d/meta.pkl", tmp_path)
    two = load_tokenizer("d/meta.pkl", tmp_path)
    assert one.identity == two.identity and one.encode("The trainer") == two.encode("The trainer")
    assert one.decode(one.encode("encodes them once.")) == "encodes them once."
    assert one.decode([one.n_vocab + 3]) == "\ufffd"
    # A character the vocabulary lacks encodes as a space (nanoGPT's own encode fails).
    assert one.decode(one.encode("aZ~#b")) == "a   b"


class _Hostile:
    """A pickle that creates a file when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_hostile_meta_pkl_is_refused_naming_it_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"vocab_size": 3, "itos": {0: "a"}, "x": _Hostile(marker)})
    pickle.loads(payload)["x"].close()  # the negative control: an ordinary load runs it
    assert marker.exists()
    marker.unlink()
    nanogpt_gpt2(tmp_path / "d", [0, 1, 2] * 100, [0, 1])
    (tmp_path / "d" / "meta.pkl").write_bytes(payload)
    with pytest.raises(MetaRefused, match=r"meta\.pkl: refused, nothing in it was run"):
        read_meta(tmp_path / "d" / "meta.pkl")
    with pytest.raises(TokenizerError, match=r"\[data\] tokenizer = 'd/meta.pkl': .*meta\.pkl"):
        load_tokenizer("d/meta.pkl", tmp_path)
    # Beside a tokens arm under another tokenizer: refused naming the arm and the file.
    with pytest.raises(SourceRejected, match=r"arm 'd': .*d/meta\.pkl: refused"):
        load_arms(_data(tmp_path, [_tokens("d", "d/train.bin")]), tmp_path, 256)
    assert not marker.exists()
    # A pickle that would call os.system is refused before anything is looked up.
    # (Written as pickle.dumps writes `os.system("touch …")`, by hand: this tier has no os.system.)
    shell = b"cposix\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR."
    (tmp_path / "d" / "meta.pkl").write_bytes(shell)
    with pytest.raises(MetaRefused, match=r"it names posix\.system, and only plain data is read"):
        read_meta(tmp_path / "d" / "meta.pkl")
    assert not marker.exists()
    # Plain data of another shape is refused too: a set is no dict, list or string.
    (tmp_path / "d" / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 2, "itos": {0, 1}}))
    with pytest.raises(MetaRefused, match="only plain dicts, lists, strings and numbers"):
        read_meta(tmp_path / "d" / "meta.pkl")


def test_a_char_level_arm_under_the_byte_tokenizer_is_refused_naming_its_meta(
    tmp_path: Path,
) -> None:
    """Its ids read as bytes would train, and decode as control characters."""
    nanogpt_char(tmp_path / "sc", TEXT)
    with pytest.raises(DataError, match=r"arm 'sc' by .*\[data\] tokenizer = 'sc/meta.pkl'"):
        check_tokenizers(_data(tmp_path, [_tokens("sc", "sc/train.bin")]), tmp_path, "bytes")


@pytest.mark.parametrize("llama", [False, True])
def test_llmc_files_are_read_by_their_header(tmp_path: Path, llama: bool) -> None:
    ids = list(range(0, 60000, 7)) * 3
    llmc_file(tmp_path / "ts" / "tiny_shakespeare_train.bin", ids, llama)
    llmc_file(tmp_path / "ts" / "tiny_shakespeare_val.bin", ids[:500], llama)
    arm = _tokens("ts", "ts/tiny_shakespeare_train.bin", heldout_path="ts/tiny_shakespeare_val.bin")
    (a,) = load_arms(_data(tmp_path, [arm]), tmp_path, 60032)
    assert a.n_tokens == len(ids) and a.heldout.shape[0] == 500
    assert np.asarray(a.tokens[np.arange(len(ids))]).tolist() == ids
    wrong = "uint16" if llama else "uint32"
    with pytest.raises(
        DataError,
        match=f"its ids are {'uint32' if llama else 'uint16'}, the arm's dtype is {wrong}",
    ):
        load_arms(_data(tmp_path, [{**arm, "dtype": wrong}]), tmp_path, 60032)
    # A count that disagrees with the file's size (a truncated copy): refused, naming both.
    path = tmp_path / "ts" / "tiny_shakespeare_train.bin"
    os.truncate(path, path.stat().st_size - 2)
    with pytest.raises(DataError, match=f"says it holds {len(ids):,} tokens"):
        load_arms(_data(tmp_path, [arm]), tmp_path, 60032)


def test_the_unknown_tokenizer_warning_is_said_once_per_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [1, 2, 3, 4] * 300
    nanogpt_gpt2(tmp_path / "owt", ids, ids)
    cfg = _data(tmp_path, [_tokens("owt", "owt/train.bin", dtype="uint16")])

    def warned() -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="andrea.daemon.data.arms"):
            load_arms(cfg, tmp_path, 256)
        return [r.levelname for r in caplog.records if "is unknown" in r.getMessage()]

    assert warned() == ["WARNING"]
    assert warned() == ["INFO"]  # the next start: said, not warned
    np.array(ids[::-1], dtype=np.uint16).tofile(tmp_path / "owt" / "train.bin")
    os.utime(tmp_path / "owt" / "train.bin", ns=(1, 1))
    assert warned() == ["WARNING"]  # another file: warned again
    # Its record, written by `andreactl tokenizer record`, says which tokenizer made it.
    record = record_existing(tmp_path / "owt" / "train.bin", ByteTokenizer(), "uint16")
    assert (record.tokens, record.dtype, record.tokenizer) == (len(ids), "uint16", "bytes")
    assert warned() == []


def test_a_record_is_refused_for_ids_the_tokenizer_does_not_have(tmp_path: Path) -> None:
    nanogpt_gpt2(tmp_path, [5, 300, 7], [1])
    with pytest.raises(DataError, match="holds the id 300"):
        record_existing(tmp_path / "train.bin", ByteTokenizer(), "uint16")
    assert not (tmp_path / "train.bin.json").exists()


def test_dtype_left_out_keeps_the_hash_of_runs_whose_arms_all_said_uint8() -> None:
    """dtype was "uint8" by default on every arm, and so in every checkpoint's config hash."""
    cfg = build_config({"data": {"arms": [{"name": "a", "kind": "text", "paths": ["*.txt"]}]}})
    old = cfg.model_dump(mode="json")
    for arm in old["data"]["arms"]:
        del arm["heldout_path"]
        arm["dtype"] = "uint8"
    assert trajectory_of(old) == cfg.trajectory()
    assert RunConfig.model_validate(old).trajectory_hash() == cfg.trajectory_hash()


def test_the_proxy_and_plan_see_the_arm_the_trainer_loads(tmp_path: Path) -> None:
    """arm_identity (the proxy's, --check's) names the arm load_arms builds, val.bin included;
    `andreactl plan` counts a header file's ids, not its bytes."""
    from andrea.control.datasize import estimated
    from andrea.daemon.data.arms import arm_identity

    nanogpt_char(tmp_path / "sc", TEXT)
    llmc_file(tmp_path / "ts" / "a_train.bin", list(range(5000)))
    arms = [
        _tokens("sc", "sc/train.bin", heldout_path="sc/val.bin"),
        _tokens("ts", "ts/a_train.bin"),
    ]
    cfg = build_config({"data": {**_data(tmp_path, arms, tokenizer="sc/meta.pkl").model_dump(
        exclude_none=True)}, "model": {"vocab_size": 5056}})  # fmt: skip
    loaded = load_arms(cfg.data, tmp_path, 5056)
    assert [arm_identity(s, cfg.data, tmp_path, 5056) for s in cfg.data.arms] == [
        a.identity for a in loaded
    ]
    plan = estimated(cfg, tmp_path)
    assert plan is not None and plan.tokens == int(len(TEXT) * 0.9) + int(5000 * 0.95)
