"""The data people bring: text and JSON Lines arms encoded with the run's tokenizer and cached, token
files that say which tokenizer made them, and the files an arm may read (regular files only)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import ArmSpec, DataConfig
from andrea.daemon.data.arms import (
    Arm,
    ArmStream,
    DataError,
    arm_identity,
    check_tokenizers,
    load_arms,
)
from andrea.daemon.data.encoding import TokensRecord, read_record, write_tokens_file
from andrea.daemon.data.heldout import is_held_out
from andrea.daemon.data.sources import SourceRejected, arm_files, jsonl_documents, read_file
from andrea.daemon.data.tokenizer import ByteTokenizer, load_tokenizer
from tests.support.owndata import PROSE, bpe_file, names, write_jsonl


def _data(tmp_path: Path, arms: list[dict], **extra) -> DataConfig:
    return DataConfig.model_validate({"arms": arms, "cache_dir": str(tmp_path / "cache"), **extra})


def test_byte_level_text_arms_keep_their_identity_and_bytes(tmp_path: Path) -> None:
    # Identities and bytes as the version before tokenizers wrote them (the same files).
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    (tmp_path / "corpus" / "a.txt").write_text("alpha\n")
    (tmp_path / "corpus" / "sub" / "b.txt").write_text("beta beta\n")
    (tmp_path / "corpus" / "c.txt").write_text("gamma\n")
    spec = [{"name": "notes", "kind": "text", "paths": ["corpus/**/*.txt"]}]
    (whole,) = load_arms(_data(tmp_path, spec), tmp_path, 256)
    assert whole.identity == "7ac5559a49c7cef648c5be7f50e85570b08246cb56d55641312427344cb178bf"
    assert bytes(np.asarray(whole.tokens)) == b"alpha\n\n\ngamma\n\n\nbeta beta\n"
    (split,) = load_arms(_data(tmp_path, spec, heldout_fraction=0.5), tmp_path, 256)
    assert split.identity == "a79df8d5a4effc19978c005bcd7f96a4820461f53009121f880e1ce6e03366c7"
    assert bytes(np.asarray(split.tokens)) == b"alpha\n"
    assert bytes(np.asarray(split.heldout)) == b"gamma\n\n\nbeta beta\n"


def test_jsonl_lines_are_documents_of_the_split(tmp_path: Path) -> None:
    held = names("{}", 0.5, True, 1)[0]
    rows = [{"text": f"line {i}", "id": i} for i in range(1, 40)]
    write_jsonl(tmp_path / "web" / "a.jsonl", rows[:20])
    write_jsonl(tmp_path / "web" / "b.jsonl.gz", rows[20:], gz=True)
    spec = [{"name": "web", "kind": "jsonl", "paths": ["web/*.jsonl*"]}]
    (arm,) = load_arms(_data(tmp_path, spec, heldout_fraction=0.5), tmp_path, 256)
    files, common = arm_files(ArmSpec.model_validate(spec[0]), tmp_path)
    docs = list(jsonl_documents(files, common, "text"))
    assert [d for d, _ in docs[:2]] == ["a.jsonl:1", "a.jsonl:2"] and docs[20][0] == "b.jsonl.gz:1"
    train = [t for d, t in docs if not is_held_out(d, 0.5)]
    assert bytes(np.asarray(arm.tokens)).decode() == "\n\n".join(train)
    assert arm.documents == 39 and 0 < arm.documents_held_out < 39
    assert held  # the rule puts some documents on each side
    other = _data(tmp_path, [{**spec[0], "field": "id"}], heldout_fraction=0.5)
    with pytest.raises(DataError, match="field 'id' is a JSON number, not a string"):
        load_arms(other, tmp_path, 256)


@pytest.mark.parametrize(
    ("content", "line", "what"),
    [
        (b'{"text": "ok"}\n{"text": "cut\n', 2, "not JSON"),
        (b'{"text": "ok"}\n\n{"text": "x"}\n', 2, "an empty line"),
        (b'{"text": "ok"}\n["text"]\n', 2, "a JSON array, not an object"),
        (b'{"text": "ok"}\n{"body": "x"}\n', 2, "no field 'text' (its fields: body)"),
        (b'{"text": 1}\n', 1, "field 'text' is a JSON number"),
        (b'{"text": null}\n', 1, "field 'text' is JSON null, not a string"),
        (b'{"text": true}\n', 1, "field 'text' is a JSON boolean"),
        (b'{"text": {"a": 1}}\n', 1, "field 'text' is a JSON object"),
        (b"7\n", 1, "a JSON number, not an object"),
    ],
)
def test_a_malformed_line_names_the_file_and_line(
    tmp_path: Path, content: bytes, line: int, what: str
) -> None:
    (tmp_path / "bad.jsonl").write_bytes(content)
    cfg = _data(tmp_path, [{"name": "web", "kind": "jsonl", "paths": ["*.jsonl"]}])
    with pytest.raises(DataError) as e:
        load_arms(cfg, tmp_path, 256)
    assert f"arm 'web': {tmp_path / 'bad.jsonl'}:{line}: {what}" in str(e.value)


def test_a_damaged_gzip_names_the_file(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl.gz", [{"text": "x" * 1000}] * 50, gz=True)
    raw = (tmp_path / "a.jsonl.gz").read_bytes()
    (tmp_path / "a.jsonl.gz").write_bytes(raw[: len(raw) // 2])
    cfg = _data(tmp_path, [{"name": "web", "kind": "jsonl", "paths": ["*.jsonl.gz"]}])
    with pytest.raises(DataError, match=r"a\.jsonl\.gz: not a readable gzip file"):
        load_arms(cfg, tmp_path, 256)


def test_subword_arms_are_encoded_once_and_name_the_tokenizer(tmp_path: Path) -> None:
    bpe_file(tmp_path / "tokenizer.json", [PROSE * 10])
    (tmp_path / "notes").mkdir()
    for i in range(6):
        (tmp_path / "notes" / f"n{i}.md").write_text(PROSE * (i + 1))
    write_jsonl(tmp_path / "web.jsonl", [{"text": PROSE[: 20 + i]} for i in range(30)])
    arms = [
        {"name": "notes", "kind": "text", "paths": ["notes/*.md"]},
        {"name": "web", "kind": "jsonl", "paths": ["web.jsonl"]},
    ]
    sub = _data(tmp_path, arms, tokenizer="tokenizer.json", heldout_fraction=0.05)
    tok = load_tokenizer("tokenizer.json", tmp_path)
    built = load_arms(sub, tmp_path, 320)
    assert all(a.tokens.dtype == np.uint16 for a in built)
    notes = built[0]
    assert tok.decode(np.asarray(notes.tokens)[:40].tolist()).startswith(PROSE[:40])
    # The tokenizer is in the identity; the proxy computes the same without building anything.
    plain = load_arms(_data(tmp_path, arms, heldout_fraction=0.05), tmp_path, 256)
    assert {a.identity for a in built}.isdisjoint(a.identity for a in plain)
    specs = [ArmSpec.model_validate(a) for a in arms]
    assert [arm_identity(s, sub, tmp_path, 320) for s in specs] == [a.identity for a in built]
    # A second start reads the cache: nothing is written, nothing encoded again.
    cache = tmp_path / "cache"
    before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    again = load_arms(sub, tmp_path, 320)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before
    assert [a.identity for a in again] == [a.identity for a in built]


def _tokens(tmp_path: Path, tokenizer, name: str = "pre.u16") -> Path:
    out = tmp_path / name
    write_tokens_file(out, [("a", PROSE * 50)], tokenizer, ["a"])
    return out


def test_a_tokens_file_says_which_tokenizer_made_it(tmp_path: Path, caplog) -> None:
    bpe_file(tmp_path / "tokenizer.json", [PROSE * 10])
    tok = load_tokenizer("tokenizer.json", tmp_path)
    out = _tokens(tmp_path, tok)
    record = read_record(out)
    assert record is not None and record.tokenizer == tok.identity and record.dtype == "uint16"
    assert record.tokens == out.stat().st_size // 2
    arm = {"name": "pre", "kind": "tokens", "path": "pre.u16", "dtype": "uint16"}
    (loaded,) = load_arms(_data(tmp_path, [arm], tokenizer="tokenizer.json"), tmp_path, 320)
    assert loaded.n_tokens == record.tokens
    # Under another tokenizer (bytes, with a byte-level arm): refused, naming the arms.
    mixed = _data(tmp_path, [arm, {"name": "code", "kind": "stdlib", "part": "comments"}])
    with pytest.raises(DataError) as e:
        load_arms(mixed, tmp_path, 320)
    message = str(e.value)
    assert (
        "different tokenizers" in message and f"arm 'pre' by sha256 {tok.identity[:12]}" in message
    )
    assert "[data] tokenizer = 'bytes'" in message and "arms code" in message
    # Without its record: an unknown tokenizer, accepted with a warning naming the arm.
    out.with_name("pre.u16.json").unlink()
    with caplog.at_level(logging.WARNING):
        load_arms(_data(tmp_path, [arm]), tmp_path, 320)
    assert "arm 'pre': which tokenizer made pre.u16 is unknown" in caplog.text
    _tokens(tmp_path, tok, "other.u16")
    wrong = {"name": "o", "kind": "tokens", "path": "other.u16", "dtype": "uint8"}
    with pytest.raises(DataError, match=r"dtype is uint8; set dtype = 'uint16'"):
        load_arms(_data(tmp_path, [wrong], tokenizer="tokenizer.json"), tmp_path, 320)


def test_an_id_beyond_the_vocabulary_names_both_settings(tmp_path: Path) -> None:
    np.arange(1000, dtype="<u2").tofile(tmp_path / "t.u16")
    arm = {"name": "t", "kind": "tokens", "path": "t.u16", "dtype": "uint16"}
    with pytest.raises(DataError) as e:
        load_arms(_data(tmp_path, [arm]), tmp_path, 256)
    assert "token id 999" in str(e.value) and "[model] vocab_size 256" in str(e.value)
    assert "[data] tokenizer" in str(e.value) and "at least 1,000" in str(e.value)


def test_an_arm_left_without_training_data_names_heldout_fraction() -> None:
    arm = Arm("one", "x", np.zeros(0, np.uint8), np.zeros(500, np.uint8), 1, 1)
    with pytest.raises(DataError) as e:
        ArmStream(arm, 0, 64)
    assert "0 training tokens" in str(e.value)
    assert "[data] heldout_fraction holds out 1 of its 1 documents" in str(e.value)


def test_an_arm_too_small_to_hold_anything_out_is_a_warning(tmp_path: Path, caplog) -> None:
    (tmp_path / "kept").mkdir()
    for name in names("kept/{}.txt", 0.05, False, 3):
        (tmp_path / name).write_text(PROSE)
    cfg = _data(tmp_path, [{"name": "small", "kind": "text", "paths": ["kept/*"]}])
    with caplog.at_level(logging.WARNING):
        load_arms(cfg.model_copy(update={"heldout_fraction": 0.05}), tmp_path, 256)
    assert "arm small is too small to hold anything out" in caplog.text


def _read_into(path: Path, result: list[BaseException]) -> None:
    try:
        read_file(path)
    except BaseException as e:  # the test looks at what it was
        result.append(e)


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    # A file of /proc: "regular", size 0, but it holds something else.
    with pytest.raises(SourceRejected, match=r"/proc/self/environ: holds more than the 0 bytes"):
        read_file(Path("/proc/self/environ"))
    with pytest.raises(SourceRejected, match=r"/proc/self/pagemap: cannot be read"):
        read_file(Path("/proc/self/pagemap"))
    # /proc/kmsg waits for the kernel's next message (as root; others may not open it): refused
    # at once, never waited on, so a stop is never ignored behind it.
    result: list[BaseException] = []
    reader = threading.Thread(target=_read_into, args=(Path("/proc/kmsg"), result), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading /proc/kmsg blocked"
    assert isinstance(result[0], SourceRejected) and "/proc/kmsg" in str(result[0]), result
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(SourceRejected, match="not a regular file .a FIFO."):
        read_file(tmp_path / "fifo")  # would block in open(2) without O_NONBLOCK
    (tmp_path / "ok.txt").write_bytes(b"x" * 3_000_000)
    assert read_file(tmp_path / "ok.txt") == b"x" * 3_000_000
    cfg = _data(tmp_path, [{"name": "p", "kind": "text", "paths": ["/proc/self/*"]}])
    with pytest.raises(SourceRejected, match=r"/proc/self/\w+"):
        load_arms(cfg, tmp_path, 256)


def test_byte_tokens_file_is_the_documents_joined(tmp_path: Path) -> None:
    out = tmp_path / "b.u8"
    record = write_tokens_file(out, [("a", b"one"), ("b", "two")], ByteTokenizer(), ["a", "b"])
    assert out.read_bytes() == b"one\n\ntwo" and record.documents == 2 and record.tokens == 8


def test_a_linked_tokens_file_has_its_record_beside_the_link(tmp_path: Path) -> None:
    """The record that says which tokenizer made a tokens file is the one beside the path the arm
    names: a link from elsewhere is described beside the link, never by its target's record."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    np.arange(200, dtype="<u2").tofile(elsewhere / "x.u16")

    def record(path: Path, tokenizer: str) -> None:
        fields = dict(n_vocab=300, dtype="uint16", tokens=200, documents=1, separator=[1],
                      sources=[], created_utc="2026-01-01T00:00:00+00:00")  # fmt: skip
        path.write_text(TokensRecord(tokenizer=tokenizer, **fields).model_dump_json())

    record(elsewhere / "x.u16.json", "a" * 64)  # the target's: another tokenizer
    run = tmp_path / "run"
    run.mkdir()
    (run / "pre.u16").symlink_to(elsewhere / "x.u16")
    arm = {"name": "pre", "kind": "tokens", "path": "pre.u16", "dtype": "uint16"}
    cfg = _data(run, [arm])
    unknown = check_tokenizers(cfg, run, "bytes")
    assert len(unknown) == 1 and "no pre.u16.json beside it" in unknown[0][1], unknown
    record(run / "pre.u16.json", "bytes")  # the link's own: the run's tokenizer
    assert check_tokenizers(cfg, run, "bytes") == []


def test_a_relative_cache_dir_is_the_run_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under systemd the working directory is `/`: a relative `[data] cache_dir` used to land
    there (or fail to), not beside the run that names it."""
    run, elsewhere = tmp_path / "run", tmp_path / "cwd"
    (run / "notes").mkdir(parents=True)
    elsewhere.mkdir()
    (run / "notes" / "a.txt").write_text(PROSE)
    monkeypatch.chdir(elsewhere)
    spec = [{"name": "notes", "kind": "text", "paths": ["notes/*.txt"]}]
    data = DataConfig.model_validate({"arms": spec, "cache_dir": "cache"})
    (arm,) = load_arms(data, run, 256)
    assert arm.n_tokens == len(PROSE.encode())
    assert any((run / "cache").iterdir()) and not (elsewhere / "cache").exists()


def test_a_text_document_over_the_bound_is_refused_naming_the_arm_and_file(
    tmp_path: Path,
) -> None:
    """Issue 50, M5: a huge single file in a text arm (one document) was read whole, then failed
    as "out of memory ... the model or its batch does not fit" (exit 2), naming neither the file
    nor the arm. It is bounded as a JSON Lines line is, before it is hashed or read."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "small.txt").write_text("a short note\n")
    (tmp_path / "notes" / "huge.txt").write_bytes(b"x" * 2048)
    spec = [{"name": "notes", "kind": "text", "paths": ["notes/*.txt"]}]
    data = _data(tmp_path, spec, max_document_bytes=1024)
    with pytest.raises(DataError) as e:
        load_arms(data, tmp_path, 256)
    assert str(e.value) == (
        f"arm 'notes': {tmp_path / 'notes' / 'huge.txt'}: a text document of 2,048 bytes, longer "
        "than 1,024 ([data] max_document_bytes: a text arm's file is one document, held whole in "
        "memory while it is encoded); split it into several files, or raise the bound"
    )
    assert not any((tmp_path / "cache").glob("*.u8"))
    # Within the bound (the default, 64 MiB, here): encoded.
    (arm,) = load_arms(_data(tmp_path, spec), tmp_path, 256)
    assert arm.n_tokens >= 2048 + len("a short note\n")  # both documents, and their joins


def test_hashing_a_large_file_says_how_far_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Identifying an arm hashes its files whole (minutes for gigabytes): progress is logged every
    HASH_LOG_EVERY_S, as an encoding's is."""
    from andrea.daemon.data.sources import HASH_LOG_EVERY_S, file_digest

    path = tmp_path / "big.txt"
    path.write_bytes(b"y" * (3 << 20))  # three chunks of 1 MiB
    ticks = iter(range(0, 1000, int(HASH_LOG_EVERY_S) + 1))
    with caplog.at_level(logging.INFO):
        size, _ = file_digest(path, clock=lambda: float(next(ticks)))
    assert size == 3 << 20
    lines = [r.getMessage() for r in caplog.records if "identifying the data" in r.getMessage()]
    assert lines[0] == f"identifying the data: {path} hashed, 1.0 MB of 3.1 MB (0 MB/s)"
    assert len(lines) == 3
