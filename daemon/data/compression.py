"""What a tokenizer makes of a sample of the data: bytes per token, and how much of the text its ids
decode back to.

A tokenizer that cannot represent a character leaves it out without a word when it has neither a
byte alphabet nor an unknown token (a BPE of two ids turned 652 kB into 32,204 tokens): the model
then trains on a fraction of the data, and its samples cannot say what was dropped. Bytes per token
alone cannot tell that from a tokenizer of long tokens on repetitive text, but the decoded text can:
a tokenizer that keeps the text decodes its ids back to about as many characters besides spaces
(which pre-tokenizers drop and decoders put back between tokens; normalizers move a few more:
case, accents), one that drops it to a fraction. Measured on a sample
at the start of an arm's encoding, `tokenizer encode`'s and `tokenizer train`'s, and said as a
warning with the figures.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from andrea.daemon.data.tokenizer import BYTES, RunTokenizer

#: Bytes of documents a sample holds (the last one cut there): enough for the figures, and little
#: enough (milliseconds) that a stop during a first start is not kept waiting.
SAMPLE_BYTES = 64 << 10
#: Below this share of the sample's bytes decoded back, the tokenizer drops text.
KEPT_FLOOR = 0.5

Document = tuple[str, str | bytes]


@dataclass(frozen=True)
class Compression:
    """A tokenizer's figures on a sample: its bytes, the tokens they became, and its characters
    besides whitespace before and after the round trip through the ids."""

    bytes: int
    tokens: int
    characters: int
    decoded_characters: int

    @property
    def bytes_per_token(self) -> float | None:
        return self.bytes / self.tokens if self.tokens else None

    @property
    def kept(self) -> float:
        """The share of the sample's characters (besides whitespace) its ids decode back to."""
        return min(self.decoded_characters / self.characters, 1.0) if self.characters else 1.0

    def warning(self) -> str | None:
        """What a person must hear when the tokenizer drops most of the text; None otherwise."""
        if self.kept >= KEPT_FLOOR:
            return None
        bpt = f"{self.bytes_per_token:.1f}" if self.bytes_per_token is not None else "no"
        return (
            f"the tokenizer drops most of the text: {self.bytes:,} bytes became {self.tokens:,} "
            f"tokens ({bpt} bytes per token), which decode back to {self.kept:.0%} of its "
            f"{self.characters:,} characters (whitespace aside); a tokenizer without a byte "
            "alphabet or an unknown token leaves out what it cannot encode, and the model never "
            "sees it: use one that encodes any text (andreactl tokenizer train makes one)"
        )


def measure(tokenizer: RunTokenizer, texts: Sequence[str | bytes]) -> Compression:
    """`tokenizer`'s figures on `texts` (bytes that are not UTF-8 text are taken as decoded with
    replacement characters: their encoding's own error is the encoder's to report)."""
    docs = [t if isinstance(t, str) else t.decode("utf-8", errors="replace") for t in texts]
    size = tokens = chars = decoded = 0
    for doc, ids in zip(docs, tokenizer.encode_batch(docs), strict=True):
        size += len(doc.encode("utf-8", errors="replace"))
        tokens += int(ids.shape[0])
        chars += _visible(doc)
        decoded += _visible(tokenizer.decode(ids.tolist()))
    return Compression(size, tokens, chars, decoded)


def _visible(text: str) -> int:
    return len("".join(text.split()))


def sampled(
    docs: Iterable[Document], tokenizer: RunTokenizer
) -> tuple[Iterator[Document], Compression | None]:
    """`docs` unchanged, and the tokenizer's figures on their first `SAMPLE_BYTES` (read ahead);
    None under the byte-level tokenizer, which keeps every byte."""
    it = iter(docs)
    if tokenizer.identity == BYTES:
        return it, None
    head: list[Document] = []
    texts: list[str | bytes] = []
    size = 0
    for doc in it:
        head.append(doc)
        texts.append(doc[1][: SAMPLE_BYTES - size])
        size += len(texts[-1])
        if size >= SAMPLE_BYTES:
            break
    return itertools.chain(head, it), measure(tokenizer, texts)
