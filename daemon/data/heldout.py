"""The held-out split: which documents of each arm are never trained on, and the fixed evaluation set.

A document is held out when a hash of its identity falls below the run's fraction — never by its
position, so adding, removing or reordering other documents never moves a document across the
split, and every run (any seed, any mixture) holds out the same documents of the same data:

    held out  ⇔  int.from_bytes(sha256("andrea.heldout.v1\\0" + document id)[:8], "big")
                 < round(fraction · 2**64)

Document ids: a text file's path relative to its arm's common directory; for the embedded corpus,
the module's path relative to the standard library's root (the same module is held out of all
three arms, so no docstring of a held-out module is trained on through another arm). A token file
has no document boundaries: its documents are consecutive spans of `TOKEN_SPAN` tokens, identified
by their index (`span:<i>`).

The split is part of the data identity (`split_identity`): a run with a split resumes only onto
the same split, and a run without one (created before splits existed, or with `heldout_fraction`
0) keeps its original identity and data, so it resumes unchanged.

The evaluation set of an arm is `eval_starts`: `count` chunks of `block_size + 1` tokens, evenly
spaced over the held-out tokens — a pure function of the data, independent of the seed, so that
runs can be compared on exactly the same sequences.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol

import numpy as np

RULE = "andrea.heldout.v1"
#: Fraction of each arm held out in a new run unless its config says otherwise.
DEFAULT_FRACTION = 0.05
#: A token file's "documents": spans of this many tokens.
TOKEN_SPAN = 1 << 16
#: What separates two documents in a text arm's token stream (unchanged from unsplit arms).
DOC_SEPARATOR = b"\n\n"


def threshold(fraction: float) -> int:
    """The 64-bit hash value below which a document is held out."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction}")
    return round(fraction * 2**64)


def is_held_out(doc_id: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"{RULE}\0{doc_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < threshold(fraction)


def split_identity(base_identity: str, fraction: float) -> str:
    """The identity of an arm's training data once `fraction` of it is held out."""
    return hashlib.sha256(f"{base_identity}\0{RULE}\0{fraction!r}".encode()).hexdigest()


def split_documents(
    docs: Iterable[tuple[str, bytes]], fraction: float
) -> tuple[bytes, bytes, int, int]:
    """(training bytes, held-out bytes, documents, documents held out) of `(id, bytes)` documents,
    each side joined with `DOC_SEPARATOR` in the given order."""
    train: list[bytes] = []
    held: list[bytes] = []
    for doc_id, data in docs:
        (held if is_held_out(doc_id, fraction) else train).append(data)
    return (
        DOC_SEPARATOR.join(train),
        DOC_SEPARATOR.join(held),
        len(train) + len(held),
        len(held),
    )


class TokenArray(Protocol):
    """What reading an arm needs of its tokens: a 1-D array, or a file read on demand
    (daemon/data/livefiles.py), indexable with integer index arrays."""

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, index: np.ndarray) -> np.ndarray: ...


class Spliced:
    """A read-only 1-D view of some `TOKEN_SPAN`-token spans of a token array, concatenated in
    order, indexable like an array with integer index arrays (what `ArmStream` needs) without
    copying a possibly huge memory-mapped file."""

    def __init__(self, base: TokenArray, spans: np.ndarray) -> None:
        self.base = base
        self.spans = np.asarray(spans, dtype=np.int64)
        self.dtype = base.dtype
        n = 0
        if len(self.spans):
            last = int(self.spans[-1])
            # Only the file's last span can be short, and if it is kept it is the last kept one.
            n = (len(self.spans) - 1) * TOKEN_SPAN + min(
                TOKEN_SPAN, base.shape[0] - last * TOKEN_SPAN
            )
        self.shape = (n,)

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        return self.base[self.spans[index // TOKEN_SPAN] * TOKEN_SPAN + index % TOKEN_SPAN]


def split_token_spans(n_tokens: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(kept span indices, held-out span indices) of a token file of `n_tokens` tokens."""
    n_spans = -(-n_tokens // TOKEN_SPAN)
    held = np.array([is_held_out(f"span:{i}", fraction) for i in range(n_spans)], dtype=bool)
    idx = np.arange(n_spans, dtype=np.int64)
    return idx[~held], idx[held]


def eval_starts(n_tokens: int, block_size: int, count: int) -> np.ndarray:
    """Start offsets of the evaluation sequences (`block_size + 1` tokens each): `count` chunks
    evenly spaced over the held-out tokens, fewer if there are not that many chunks."""
    n_chunks = max(0, (n_tokens - 1) // block_size)
    k = min(count, n_chunks)
    return (np.arange(k, dtype=np.int64) * n_chunks // max(k, 1)) * block_size
