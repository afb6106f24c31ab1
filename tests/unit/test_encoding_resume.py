"""An arm's encoding that a stop interrupts is kept in the token cache, and the next encoding continues
it (daemon/data/partial.py): the finished entry is byte for byte the one an uninterrupted encoding
writes, whatever was written after the last save (a SIGKILL) and whatever damaged what was kept."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import DataConfig
from andrea.daemon.data import encoding, encoding_progress, partial, tokencache
from andrea.daemon.data.arms import load_arms
from andrea.daemon.data.encoding import Written, counts_path, split_paths, write_arm
from andrea.daemon.data.encoding_progress import EncodingProgress
from andrea.daemon.data.tokenizer import RunTokenizer, load_tokenizer
from tests.support.owndata import PROSE, bpe_file

FRACTION = 0.1


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many batches from a small corpus: a stop lands in the middle of the encoding.
    monkeypatch.setattr(encoding, "BATCH_DOCUMENTS", 8)


@pytest.fixture
def tokenizer(tmp_path: Path) -> RunTokenizer:
    bpe_file(tmp_path / "tokenizer.json", [PROSE * 20])
    return load_tokenizer("tokenizer.json", tmp_path)


def _docs() -> list[tuple[str, str]]:
    return [(f"notes/n{i:03d}.md", f"{i} {PROSE[: 40 + i % 90]}") for i in range(300)]


def _stop_after(documents: int) -> tuple[list[bool], encoding.Progress]:
    """A stop flag, and a progress callback that raises it once `documents` are encoded."""
    flag = [False]

    def progress(_: int, done: int) -> None:
        flag[0] = flag[0] or done >= documents

    return flag, progress


def _entry(cache: Path, tokenizer: RunTokenizer) -> dict[str, bytes]:
    train, held = split_paths(cache, "arm", tokenizer.suffix)
    return {p.name: p.read_bytes() for p in (train, held, counts_path(cache, "arm"))}


def _write(cache: Path, tokenizer: RunTokenizer, stop_at: int | None = None) -> Written:
    cache.mkdir(exist_ok=True)
    flag, progress = _stop_after(stop_at if stop_at is not None else 10**9)
    return write_arm(
        cache, "arm", _docs(), tokenizer, FRACTION, lambda: flag[0], progress, arm="notes"
    )


def _interrupted(cache: Path, tokenizer: RunTokenizer, at: int) -> None:
    with pytest.raises(InterruptedError):
        _write(cache, tokenizer, stop_at=at)
    assert partial.record_path(cache, "arm").exists()


def _relative(w: Written) -> tuple:
    return [(p.name, n, h) for p, n, h in w.files], w.documents, w.documents_held_out


def test_a_stopped_encoding_continues_to_the_same_bytes(tmp_path: Path, tokenizer, caplog) -> None:
    whole = _write(tmp_path / "whole", tokenizer)
    cache = tmp_path / "resumed"
    _interrupted(cache, tokenizer, at=100)
    _interrupted(cache, tokenizer, at=180)  # a second stop goes on from the first's
    with caplog.at_level(logging.INFO, logger="andrea.daemon.data.encoding"):
        resumed = _write(cache, tokenizer)
    assert _entry(cache, tokenizer) == _entry(tmp_path / "whole", tokenizer)
    assert _relative(resumed) == _relative(whole)
    said = [r.getMessage() for r in caplog.records if "continuing" in r.getMessage()]
    assert len(said) == 1 and "arm notes: continuing the encoding" in said[0], said
    assert "were encoded already and are not encoded again" in said[0]
    # Nothing of the encoding in progress is left once the entry is complete.
    assert not list(cache.glob("*.partial*")), sorted(p.name for p in cache.iterdir())


def test_what_was_written_after_the_last_save_is_cut_off(tmp_path: Path, tokenizer) -> None:
    """A SIGKILL between two saves leaves bytes past the recorded sizes: they are dropped."""
    whole = _write(tmp_path / "whole", tokenizer)
    cache = tmp_path / "killed"
    _interrupted(cache, tokenizer, at=120)
    for p in split_paths(cache, "arm", tokenizer.suffix):
        with open(partial.partial_path(p), "ab") as f:
            f.write(b"\x07" * 10)  # half a batch nobody recorded
    assert _relative(_write(cache, tokenizer)) == _relative(whole)
    assert _entry(cache, tokenizer) == _entry(tmp_path / "whole", tokenizer)


@pytest.mark.parametrize(
    "damage", ["flipped byte", "cut file", "record garbage", "other tokenizer"]
)
def test_a_damaged_kept_encoding_begins_again(
    tmp_path: Path, tokenizer, damage: str, caplog
) -> None:
    whole = _write(tmp_path / "whole", tokenizer)
    cache = tmp_path / "damaged"
    _interrupted(cache, tokenizer, at=150)
    train = partial.partial_path(split_paths(cache, "arm", tokenizer.suffix)[0])
    record = partial.record_path(cache, "arm")
    if damage == "flipped byte":
        data = bytearray(train.read_bytes())
        data[5] ^= 0xFF
        train.write_bytes(bytes(data))
    elif damage == "cut file":
        train.write_bytes(train.read_bytes()[:-3])
    elif damage == "record garbage":
        record.write_text("{not json")
    else:
        record.write_text(record.read_text().replace(tokenizer.identity, "0" * 64))
    with caplog.at_level(logging.WARNING, logger="andrea.daemon.data.partial"):
        again = _write(cache, tokenizer)
    assert "encoding the arm from its beginning" in caplog.text, caplog.text
    assert str(cache) in caplog.text
    assert _relative(again) == _relative(whole)
    assert _entry(cache, tokenizer) == _entry(tmp_path / "whole", tokenizer)


def test_a_stop_during_a_start_is_continued_by_the_next_start(
    tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """load_arms, as a start runs it: the entry it finishes after a stop passes the cache's
    verification, and its tokens are those a start never stopped encodes."""
    monkeypatch.setattr(encoding_progress, "NOTIFY_EVERY_S", 0.0)
    notes = tmp_path / "notes"
    notes.mkdir()
    for doc_id, text in _docs():
        (tmp_path / doc_id).write_text(text)
    arms = [{"name": "notes", "kind": "text", "paths": ["notes/*.md"]}]

    def cfg(cache: str) -> DataConfig:
        return DataConfig.model_validate(
            {
                "arms": arms,
                "cache_dir": str(tmp_path / cache),
                "tokenizer": "tokenizer.json",
                "heldout_fraction": FRACTION,
            }
        )

    (fresh,) = load_arms(cfg("fresh"), tmp_path, 320)
    stop = [False]
    told: list[int] = []

    def heard(p: object) -> None:  # what the trainer would tell systemd
        told.append(p.documents)  # type: ignore[attr-defined]
        stop[0] = p.documents >= 150  # type: ignore[attr-defined]

    with pytest.raises(InterruptedError):
        load_arms(
            cfg("cache"), tmp_path, 320, lambda: stop[0], None, EncodingProgress(on_advance=heard)
        )
    assert told and told == sorted(told), told  # told as it advanced
    with caplog.at_level(logging.INFO, logger="andrea.daemon.data.encoding"):
        (arm,) = load_arms(cfg("cache"), tmp_path, 320)
    assert "arm notes: continuing the encoding" in caplog.text
    assert np.array_equal(np.asarray(arm.tokens), np.asarray(fresh.tokens))
    assert arm.heldout is not None and fresh.heldout is not None
    assert np.array_equal(np.asarray(arm.heldout), np.asarray(fresh.heldout))
    tok = load_tokenizer("tokenizer.json", tmp_path)
    assert tokencache.verified(tmp_path / "cache", arm.identity, tok, repair=False) is not None
