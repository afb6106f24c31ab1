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
