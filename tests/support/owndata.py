"""Data a user brings, for the tests: a small subword tokenizer, text files, JSON Lines, and names
that the held-out rule puts on either side of the split."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from andrea.daemon.data.heldout import is_held_out

PROSE = (
    "The trainer reads the documents a person brings, encodes them once with the run's tokenizer "
    "and trains on every arm. Held-out documents are never trained on; they score the model. "
)


def bpe_file(path: Path, texts: Iterable[str], vocab_size: int = 300) -> Path:
    """Train a byte-level BPE on `texts` (as `andreactl tokenizer train` does) and save it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def write_jsonl(path: Path, rows: Iterable[dict], gz: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def hub_texts(n: int, tag: str) -> list[str]:
    """`n` documents of different lengths, each naming `tag` and its number."""
    return [f"{tag} {i}: " + PROSE[: 40 + 7 * i % 200] for i in range(n)]


def write_hub(root: Path, shards: int = 2, rows: int = 300) -> list[str]:
    """A Hugging Face dataset as the Hub serves it: data/train-0000i-of-0000n.parquet, written by
    pyarrow with several row groups each, a text column among others; the texts, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True, exist_ok=True)
    out = []
    for s in range(shards):
        texts = hub_texts(rows, f"shard {s}")
        table = pa.table({"id": list(range(rows)), "text": texts, "url": ["u"] * rows})
        name = f"train-{s:05d}-of-{shards:05d}.parquet"
        pq.write_table(table, root / "data" / name, row_group_size=64)
        out += texts
    return out


def slim_line(text: str) -> str:
    return json.dumps({"text": text, "meta": {"redpajama_set_name": "RedPajamaWikipedia"}}) + "\n"


def write_slim(path: Path, texts: list[str], frames: int = 1) -> Path:
    """JSON Lines compressed with zstd, as SlimPajama's chunks are (`frames` > 1: several frames,
    as pzstd writes)."""
    import zstandard

    lines = [slim_line(t) for t in texts]
    step = -(-len(lines) // frames)
    parts = ["".join(lines[i : i + step]).encode() for i in range(0, len(lines), step)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(zstandard.ZstdCompressor(level=3).compress(p) for p in parts))
    return path


def names(pattern: str, fraction: float, held: bool, count: int) -> list[str]:
    """`count` document ids `pattern.format(i)` that the held-out rule puts held out (or not)."""
    out, i = [], 0
    while len(out) < count:
        name = pattern.format(i)
        if is_held_out(name, fraction) == held:
            out.append(name)
        i += 1
    return out


def word_level_file(path: Path, words: Iterable[str], unk: bool = False) -> Path:
    """A WordLevel tokenizer of `words` (whitespace-split), with or without an unknown token: one
    without cannot encode a word it lacks."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(dict.fromkeys([*words, *(["[UNK]"] if unk else [])]))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]" if unk else None))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def sparse_bpe_file(path: Path, top: int = 100_000_000) -> Path:
    """A BPE of two tokens whose second id is `top`: a model would need `top + 1` rows."""
    from tokenizers import Tokenizer, models

    path.parent.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.BPE(vocab={"a": 0, "b": top}, merges=[])).save(str(path))
    return path


def two_id_bpe_file(path: Path) -> Path:
    """A BPE of two tokens ("a" and "e") without a byte alphabet or an unknown token: it leaves
    out every other character without a word."""
    from tokenizers import Tokenizer, models

    path.parent.mkdir(parents=True, exist_ok=True)
    Tokenizer(models.BPE(vocab={"a": 0, "e": 1}, merges=[])).save(str(path))
    return path


def gzip_bomb(path: Path, mib: int) -> Path:
    """A .gz of `mib` MiB of NUL bytes and no newline: members of 64 MiB each, compressed once."""
    member = gzip.compress(bytes(64 << 20), compresslevel=9)
    path.write_bytes(member * (mib // 64))
    return path


def nanogpt_char(folder: Path, text: str) -> dict:
    """What nanoGPT's data/shakespeare_char/prepare.py writes for `text`: train.bin and val.bin
    (the first 90% and the rest, uint16 ids) and meta.pkl; the meta it pickled."""
    import pickle

    import numpy as np

    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    n = len(text)
    train_ids = [stoi[c] for c in text[: int(n * 0.9)]]
    val_ids = [stoi[c] for c in text[int(n * 0.9) :]]
    folder.mkdir(parents=True, exist_ok=True)
    np.array(train_ids, dtype=np.uint16).tofile(folder / "train.bin")
    np.array(val_ids, dtype=np.uint16).tofile(folder / "val.bin")
    meta = {"vocab_size": len(chars), "itos": itos, "stoi": stoi}
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    return meta


def nanogpt_gpt2(folder: Path, train_ids: list[int], val_ids: list[int]) -> None:
    """What nanoGPT's data/openwebtext/prepare.py (tiktoken's GPT-2 ids) leaves: train.bin and
    val.bin of uint16 ids, no meta.pkl."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    np.array(train_ids, dtype=np.uint16).tofile(folder / "train.bin")
    np.array(val_ids, dtype=np.uint16).tofile(folder / "val.bin")


def llmc_file(path: Path, ids: list[int], llama: bool = False) -> None:
    """What llm.c's dev/data/data_common.py write_datafile writes: 256 int32 (magic, version,
    token count), then the ids (uint16 for GPT-2, uint32 for Llama 3)."""
    import numpy as np

    header = np.zeros(256, dtype=np.int32)
    header[0] = 20240801 if llama else 20240520
    header[1] = 7 if llama else 1
    header[2] = len(ids)
    toks = np.array(ids, dtype=np.uint32 if llama else np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.tobytes())


def gpt2_sized_tokenizer(path: Path) -> Path:
    """A byte-level BPE of GPT-2's 50,257 ids (its 256 byte symbols, fillers, and
    <|endoftext|> last): a stand-in for GPT-2's tokenizer.json, which is a download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({f"tok{i}": i for i in range(len(alphabet), 50256)})
    vocab["<|endoftext|>"] = 50256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path
