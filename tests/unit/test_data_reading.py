"""Reading an arm's files against hostile content and a damaged or full token cache: JSON Lines lines
have a bound (a gzip bomb without a newline included), lone surrogates become U+FFFD, a cache entry
is trusted only when it is what its encoding recorded, and a failed write leaves no temporary file.
"""

from __future__ import annotations

import json
import logging
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import DataConfig
from andrea.daemon.data import tokencache
from andrea.daemon.data.arms import DataError, load_arms
from andrea.daemon.data.encoding import split_paths
from andrea.daemon.data.encoding_progress import EncodingProgress, describe
from andrea.daemon.data.sources import jsonl_documents
from tests.support.owndata import PROSE, bpe_file, gzip_bomb, write_jsonl

KINDS = ("garbage docs.json", "odd-size tokens", "ids out of range", "emptied", "record garbage")


def _data(tmp_path: Path, arms: list[dict], **extra) -> DataConfig:
    return DataConfig.model_validate({"arms": arms, "cache_dir": str(tmp_path / "cache"), **extra})


def test_a_line_longer_than_the_bound_names_the_file_and_line(tmp_path: Path) -> None:
    rows = [{"text": "short"}, {"text": "x" * 5000}, {"text": "after"}]
    write_jsonl(tmp_path / "web.jsonl", rows)
    docs = jsonl_documents([tmp_path / "web.jsonl"], tmp_path, "text", bound=4096)
    assert next(docs) == ("web.jsonl:1", "short")
    with pytest.raises(DataError, match=r"web.jsonl:2: a line longer than 4,096 bytes"):
        next(docs)
    # At the bound exactly, and a last line without its newline, are read.
    exact = json.dumps({"text": "y" * 100}).encode()
    (tmp_path / "exact.jsonl").write_bytes(b'{"text": "a"}\n' + exact)
    got = list(jsonl_documents([tmp_path / "exact.jsonl"], tmp_path, "text", bound=len(exact)))
    assert got == [("exact.jsonl:1", "a"), ("exact.jsonl:2", "y" * 100)]


def test_a_gzip_bomb_without_a_newline_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "bomb.jsonl.gz", 512)
    assert bomb.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"bomb.jsonl.gz:1: a line longer than 16,777,216"):
            list(jsonl_documents([bomb], tmp_path, "text", bound=16 << 20))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak:,} bytes held to refuse a 512 MiB line"


def test_a_stop_is_honoured_inside_one_long_line(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "bomb.jsonl.gz", 256)
    chunks = []
    with pytest.raises(InterruptedError):
        # Asked after the first chunks: a line is never read whole before a stop is seen.
        list(jsonl_documents([bomb], tmp_path, "text", lambda: len(chunks.append(1) or chunks) > 3))
    assert len(chunks) == 4


def test_lone_surrogates_become_the_replacement_character(tmp_path: Path, caplog) -> None:
    path = tmp_path / "web.jsonl"
    path.write_text(
        '{"text": "lone \\ud800 x"}\n{"text": "pair \\ud83d\\ude00 ok"}\n'
        '{"text": "\\udfff and \\ud800"}\n',
        encoding="ascii",
    )
    with caplog.at_level(logging.WARNING):
        got = [t for _, t in jsonl_documents([path], tmp_path, "text")]
    assert got == ["lone \ufffd x", "pair \U0001f600 ok", "\ufffd and \ufffd"]
    warnings = [r.getMessage() for r in caplog.records if "surrogate" in r.getMessage()]
    assert len(warnings) == 1 and "3 lone surrogate" in warnings[0] and "line 1" in warnings[0]
    # Every tokenizer then encodes them.
    bpe_file(tmp_path / "tokenizer.json", [PROSE])
    arms = [{"name": "web", "kind": "jsonl", "paths": ["web.jsonl"]}]
    for spec, vocab in (("bytes", 256), ("tokenizer.json", 320)):
        (arm,) = load_arms(_data(tmp_path, arms, tokenizer=spec), tmp_path, vocab)
        assert arm.n_tokens > 0


def _arm_with_entry(tmp_path: Path) -> tuple[DataConfig, Path, str]:
    (tmp_path / "notes").mkdir()
    for i in range(20):
        (tmp_path / "notes" / f"n{i}.md").write_text(f"{i} " + PROSE * (i + 1))
    arms = [{"name": "notes", "kind": "text", "paths": ["notes/*.md"]}]
    cfg = _data(tmp_path, arms, heldout_fraction=0.2)
    (arm,) = load_arms(cfg, tmp_path, 256)
    return cfg, tmp_path / "cache", arm.identity


def _damage(cache: Path, identity: str, kind: str) -> Path:
    train, _ = split_paths(cache, identity, "u8")
    if kind == "garbage docs.json":
        target = cache / f"{identity}.docs.json"
        target.write_bytes(b"\x00garbage{")
    elif kind == "odd-size tokens":  # a u16 entry would be cut to an odd size: a u8 one is cut
        target = train
        os.truncate(target, target.stat().st_size - 1)
    elif kind == "ids out of range":
        target = train
        with open(target, "r+b") as f:
            f.seek(10)
            f.write(b"\xff\xff\xff")
    elif kind == "emptied":
        target = train
        os.truncate(target, 0)
    else:
        target = tokencache.record_path(cache, identity)
        target.write_text("{not json")
    return target


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_cache_entry_is_encoded_again(tmp_path: Path, kind: str, caplog) -> None:
    cfg, cache, identity = _arm_with_entry(tmp_path)
    good = {p.name: p.read_bytes() for p in cache.iterdir()}
    target = _damage(cache, identity, kind)
    with caplog.at_level(logging.WARNING):
        (arm,) = load_arms(cfg, tmp_path, 256)
    assert any(str(target) in r.getMessage() for r in caplog.records), caplog.text
    # The entry is the one the first encoding wrote, byte for byte.
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == good
    assert arm.identity == identity and arm.documents == 20


def test_an_entry_without_its_record_is_not_trusted(tmp_path: Path, caplog) -> None:
    cfg, cache, identity = _arm_with_entry(tmp_path)
    tokencache.record_path(cache, identity).unlink()
    train, _ = split_paths(cache, identity, "u8")
    train.write_bytes(b"")  # what an entry of an older version, emptied, would look like
    with caplog.at_level(logging.WARNING):
        (arm,) = load_arms(cfg, tmp_path, 256)
    assert "is missing" in caplog.text
    assert arm.n_tokens > 0 and tokencache.record_path(cache, identity).exists()


def test_a_subword_entry_of_another_vocabulary_is_not_trusted(tmp_path: Path) -> None:
    # Ids out of range of a u16 entry: caught by the hash, never mapped.
    bpe_file(tmp_path / "tokenizer.json", [PROSE * 5])
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text(PROSE * 30)
    arms = [{"name": "notes", "kind": "text", "paths": ["notes/*.md"]}]
    cfg = _data(tmp_path, arms, tokenizer="tokenizer.json")
    (arm,) = load_arms(cfg, tmp_path, 320)
    expected = np.asarray(arm.tokens).copy()
    train, _ = split_paths(tmp_path / "cache", arm.identity, "u16")
    np.full(4, 65535, dtype="<u2").tofile(train)
    (again,) = load_arms(cfg, tmp_path, 320)
    assert np.array_equal(np.asarray(again.tokens), expected)


def test_encoding_progress_says_bytes_documents_rate_and_time_left(caplog) -> None:
    now = [0.0]
    p = EncodingProgress(clock=lambda: now[0])
    p.start("web", 100_000_000, None)
    with caplog.at_level(logging.INFO, logger="andrea.daemon.data.encoding_progress"):
        for second in range(1, 25):
            now[0] = float(second)
            p.update(2_000_000 * second, 100 * second)
    status = p.status()
    assert status is not None and status.bytes_done == 48_000_000 and status.documents == 2400
    assert status.bytes_per_second == 2_000_000 and status.eta_seconds == 26
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # at 10 s and 20 s
    assert "40%" in lines[1] and "2,000 documents" in lines[1] and "2.0 MB/s" in lines[1]
    assert "about 30s left" in lines[1] and lines[1].startswith("arm web: encoding")
    assert describe(status).startswith("arm web: encoding, 48% (48.0 of 100.0 MB read")
    p.finish()
    assert p.status() is None
