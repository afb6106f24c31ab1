"""The run's tokenizer: how text becomes token ids and ids become text again.

`[data] tokenizer` is either ``"bytes"`` (the default, and what every run created before tokenizers
existed resumes with: token = byte value, 256 ids, nothing to download) or the path of a Hugging Face
`tokenizers` file (``tokenizer.json``, relative paths against the run directory), the format every
model hub reads and ``andreactl tokenizer train`` writes, or of a nanoGPT character-level
``meta.pkl`` (read as plain data, and made into such a file: daemon/data/nanogpt_meta.py).

A tokenizer is part of the data contract: its identity (``"bytes"``, or the sha256 of the file's
bytes) enters the identity of every arm it encodes and every checkpoint's manifest, so a run resumes
only under the tokenizer that encoded its data. The vocabulary a model needs is the tokenizer's size
rounded up to a multiple of `VOCAB_MULTIPLE` (nanoGPT's 50,257 → 50,304).

Decoding never fails: an id the tokenizer does not have (the rows of that rounding, or an id of a
token file from an unknown tokenizer) decodes as U+FFFD, so that a sample never ends a run.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from andrea.daemon.config import MAX_VOCAB_SIZE, ConfigError
from andrea.daemon.data.nanogpt_meta import MetaRefused, is_meta, read_meta, tokenizer_json
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded

#: `[data] tokenizer` of the byte-level tokenizer.
BYTES = "bytes"
#: A vocabulary is rounded up to a multiple of this: matrix shapes the GPU's kernels handle well.
VOCAB_MULTIPLE = 64
#: Text that separates two documents in an arm's token stream (encoded by the run's tokenizer).
DOC_SEPARATOR_TEXT = "\n\n"
#: The special token that `andreactl tokenizer train` reserves (id 0) and that joins documents
#: instead of `DOC_SEPARATOR_TEXT` under a tokenizer that has it: the end of a document, which
#: the Hugging Face export names as its eos_token (generation stops there) and pad_token (batches).
#: Not GPT-2's "<|endoftext|>": tokenizer files that runs already use carry that one (GPT-2's,
#: StarCoder's), and their documents must stay joined as they were, the token cache's identity
#: being the tokenizer file's sha256 and never how it joins.
END_OF_DOCUMENT = "<|endofdocument|>"
#: The largest tokenizer file read (the big public ones are a few tens of MB).
MAX_TOKENIZER_BYTES = 256 << 20
_REPLACEMENT = "\ufffd"
#: Ids a tokenizer may leave unused beyond as many as it has tokens (reserved ranges are common).
SPARSE_SLACK = 1024


class TokenizerError(ConfigError):
    """`[data] tokenizer` names no usable tokenizer; the message says which setting to change."""


def padded_vocab(n: int) -> int:
    """`n` ids rounded up to a multiple of `VOCAB_MULTIPLE`."""
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def dtype_for(n_vocab: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id below `n_vocab`."""
    for name in ("uint8", "uint16", "uint32"):
        if n_vocab <= np.iinfo(name).max + 1:
            return np.dtype(name)
    raise TokenizerError(f"a vocabulary of {n_vocab:,} ids does not fit 32-bit token files")


def vocab_too_small(vocab_size: int, tokenizer: RunTokenizer) -> str:
    """The refusal of a `[model] vocab_size` below the tokenizer's size, naming both."""
    n = tokenizer.n_vocab
    return (
        f"[model] vocab_size {vocab_size:,} is smaller than the {n:,} ids of the run's tokenizer "
        f"([data] tokenizer = {tokenizer.spec!r}): leave vocab_size out to get "
        f"{padded_vocab(n):,} (the tokenizer's size rounded up to a multiple of {VOCAB_MULTIPLE}), "
        f"or set at least {n:,}"
    )


def check_vocab(vocab_size: int, tokenizer: RunTokenizer, encoded_arms: bool) -> None:
    """TokenizerError when the model's vocabulary cannot hold the tokenizer's ids: always under a
    subword tokenizer, and under the byte-level one when an arm is encoded with it (a run of token
    files alone may keep a smaller vocabulary, which its ids then must fit)."""
    if (encoded_arms or tokenizer.identity != BYTES) and vocab_size < tokenizer.n_vocab:
        raise TokenizerError(vocab_too_small(vocab_size, tokenizer))


class RunTokenizer:
    """What the run's data, samples and exports are encoded and decoded with."""

    #: As configured: "bytes" or the path written in `[data] tokenizer`.
    spec: str
    #: "bytes", or the sha256 of the tokenizer file: part of every arm's and checkpoint's identity.
    identity: str
    #: Ids the tokenizer can produce: 0 .. n_vocab - 1.
    n_vocab: int

    @functools.cached_property
    def dtype(self) -> np.dtype:
        """The token files' integer type under this tokenizer."""
        return dtype_for(self.n_vocab)

    @property
    def suffix(self) -> str:
        """The cache files' suffix: u8, u16 or u32."""
        return "u" + str(8 * self.dtype.itemsize)

    @functools.cached_property
    def separator(self) -> np.ndarray:
        """The ids placed between two documents: the end-of-document token where the tokenizer
        has one, else the encoding of a blank line."""
        if self.end_of_document is not None:
            return np.array([self.end_of_document], dtype=self.dtype)
        return self.encode_batch([DOC_SEPARATOR_TEXT])[0]

    @property
    def end_of_document(self) -> int | None:
        """The id of the special token `END_OF_DOCUMENT`; None when the tokenizer has none."""
        return None

    def describe(self, full: bool = False) -> str:
        """The tokenizer for a person: which, its identity (whole with `full`) and size."""
        if self.identity == BYTES:
            return "bytes (byte-level: token = byte value, 256 ids)"
        sha = self.identity if full else self.identity[:12] + "…"
        return f"{self.spec} (sha256 {sha}, {self.n_vocab:,} ids)"

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0].tolist()

    def encode_batch(self, docs: Sequence[str | bytes]) -> list[np.ndarray]:
        """Each document's ids, in `dtype`. UnicodeDecodeError for bytes that are not UTF-8 text
        (a subword tokenizer encodes text; the byte-level one takes any bytes)."""
        return [self.as_array(e) for e in self.encode_raw(docs)]

    def encode_raw(self, docs: Sequence[str | bytes]) -> list[Any]:
        """`encode_batch` in two halves: the encoding (which may run on another thread), ..."""
        raise NotImplementedError

    def as_array(self, encoded: Any) -> np.ndarray:
        """... then one document's ids as an array of `dtype`."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`; an id outside the tokenizer is U+FFFD. Never raises."""
        raise NotImplementedError


class ByteTokenizer(RunTokenizer):
    """Token = byte value: 256 ids, any bytes."""

    spec = BYTES
    identity = BYTES
    n_vocab = 256

    def encode_raw(self, docs: Sequence[str | bytes]) -> list[Any]:
        return [d.encode("utf-8") if isinstance(d, str) else d for d in docs]

    def as_array(self, encoded: Any) -> np.ndarray:
        return np.frombuffer(encoded, dtype=np.uint8)

    def decode(self, ids: Sequence[int]) -> str:
        out, run = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace") + _REPLACEMENT)
            run = bytearray()
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


class FileTokenizer(RunTokenizer):
    """A Hugging Face `tokenizers` file."""

    def __init__(self, spec: str, path: Path, raw: bytes) -> None:
        from tokenizers import Tokenizer

        self.spec = spec
        self.path = path
        self.identity = hashlib.sha256(raw).hexdigest()
        try:
            self.hf: Any = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # the library raises a bare Exception for a malformed file
            raise TokenizerError(
                f"[data] tokenizer = {spec!r}: {path} is not a tokenizers file ({e})"
            ) from None
        ids = set(self.hf.get_vocab(with_added_tokens=True).values())
        self.n_vocab = max(self.hf.get_vocab_size(with_added_tokens=True), max(ids, default=-1) + 1)
        if self.n_vocab < 1:
            raise TokenizerError(f"[data] tokenizer = {spec!r}: {path} has an empty vocabulary")
        _check_dense(spec, path, len(ids), self.n_vocab)
        self._end_of_document = _special_id(self.hf, END_OF_DOCUMENT)
        if self._end_of_document is not None:
            # The token's text inside a document is text, never the end of one (tokenizers turns
            # an added token's text into its id unless told); files without it keep their rule.
            self.hf.encode_special_tokens = True
        self._encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)

    @property
    def end_of_document(self) -> int | None:
        return self._end_of_document

    def encode_raw(self, docs: Sequence[str | bytes]) -> list[Any]:
        texts = [d if isinstance(d, str) else d.decode("utf-8") for d in docs]
        try:
            return self._encode(texts, add_special_tokens=False)
        except Exception as e:  # the library raises a bare Exception ("Missing [UNK] token")
            raise TokenizerError(
                f"[data] tokenizer = {self.spec!r}: {self.path} cannot encode the data ({e}): "
                "a tokenizer must encode any text; give it an unknown token ([UNK]) or a byte "
                "alphabet (andreactl tokenizer train makes one that encodes anything)"
            ) from None

    def as_array(self, encoded: Any) -> np.ndarray:
        return np.array(encoded.ids, dtype=self.dtype)

    def decode(self, ids: Sequence[int]) -> str:
        out, run = [], []
        for i in ids:
            if 0 <= i < self.n_vocab:
                run.append(int(i))
                continue
            out.append(self._decode(run) + _REPLACEMENT)
            run = []
        out.append(self._decode(run))
        return "".join(out)

    def _decode(self, ids: list[int]) -> str:
        try:
            return self.hf.decode(ids, skip_special_tokens=False) if ids else ""
        except Exception:  # an id the file's model lacks although its vocabulary counts it
            return _REPLACEMENT * len(ids)


def _special_id(hf: Any, content: str) -> int | None:
    """The id of the special added token `content` of the tokenizers object `hf`; None without."""
    for i, token in hf.get_added_tokens_decoder().items():
        if token.content == content and token.special:
            return int(i)
    return None


def describe_identity(identity: str) -> str:
    """A tokenizer known by its identity alone (a manifest's, a record's), for a person."""
    return BYTES if identity == BYTES else f"the tokenizer of sha256 {identity}"


def _check_dense(spec: str, path: Path, tokens: int, n_vocab: int) -> None:
    """TokenizerError, before any model is built, for ids a model cannot or should not hold: past
    `MAX_VOCAB_SIZE`, or mostly unused (the model's rows are ids, not tokens)."""
    unused = n_vocab - tokens
    if n_vocab > MAX_VOCAB_SIZE or unused > max(tokens, SPARSE_SLACK):
        raise TokenizerError(
            f"[data] tokenizer = {spec!r}: {path} has {tokens:,} tokens with ids up to "
            f"{n_vocab - 1:,}: a model would need {n_vocab:,} rows ([model] vocab_size), "
            f"{unused:,} of them for ids no token has"
            + (
                f", more than the {MAX_VOCAB_SIZE:,} a model may hold"
                if n_vocab > MAX_VOCAB_SIZE
                else ""
            )
            + "; renumber its ids from 0 without gaps, or train one (andreactl tokenizer train)"
        )


def tokenizer_path(spec: str, base: Path) -> Path:
    """Where `[data] tokenizer = spec` points (relative paths against the run directory)."""
    return base / Path(spec).expanduser()


def tokenizer_bytes(spec: str, base: Path, follow_symlinks: bool = True) -> tuple[Path, bytes]:
    """Where `[data] tokenizer = spec` points, and the bytes of its ``tokenizers`` file: the file
    itself, or the one built from a nanoGPT meta.pkl (daemon/data/nanogpt_meta.py). FileRejected or
    OSError when it cannot be read; TokenizerError for a meta.pkl refused."""
    path = tokenizer_path(spec, base)
    if not is_meta(spec):
        return path, read_bounded(path, MAX_TOKENIZER_BYTES, follow_symlinks=follow_symlinks)
    if not follow_symlinks and path.is_symlink():
        raise FileRejected(f"{path} is a symbolic link")
    try:
        return path, tokenizer_json(read_meta(path))
    except MetaRefused as e:
        raise TokenizerError(f"[data] tokenizer = {spec!r}: {e}") from None


def _read(spec: str, base: Path) -> tuple[Path, bytes]:
    path = tokenizer_path(spec, base)
    if is_meta(spec) and not path.exists():
        raise TokenizerError(
            f"[data] tokenizer = {spec!r}: {path} does not exist; name the meta.pkl nanoGPT's "
            "prepare.py wrote beside train.bin"
        )
    try:
        return tokenizer_bytes(spec, base)
    except FileNotFoundError:
        raise TokenizerError(
            f"[data] tokenizer = {spec!r}: {path} does not exist; train one with `andreactl "
            'tokenizer train --run-dir DIR --vocab-size N`, or set tokenizer = "bytes"'
        ) from None
    except (FileRejected, OSError) as e:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TokenizerError(f"[data] tokenizer = {spec!r}: {path}: {detail}") from None


def load_tokenizer(spec: str, base: Path) -> RunTokenizer:
    """The tokenizer `[data] tokenizer = spec` names. TokenizerError naming the setting."""
    if spec == BYTES:
        return ByteTokenizer()
    path, raw = _read(spec, base)
    return FileTokenizer(spec, path, raw)


def tokenizer_identity(spec: str, base: Path) -> str:
    """The identity `load_tokenizer(spec, base)` has, without parsing the file."""
    if spec == BYTES:
        return BYTES
    return hashlib.sha256(_read(spec, base)[1]).hexdigest()
