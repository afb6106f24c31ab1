"""Data arms: materialised token arrays, their identities, and a resumable order over each.

How an arm is read is its kind's (daemon/data/kinds/: one module a kind, looked up in the
registry). The documents of an encoded kind (`stdlib`, `text`, `jsonl`, `parquet`) are encoded with
the run's tokenizer (daemon/data/tokenizer.py: bytes by default, or a subword `tokenizer.json`)
once, here, and cached under their identity; a kind of ids (`tokens`: pre-tokenized flat files of
uint8/16/32 ids, memory-mapped, that say which tokenizer made them) loads its arm itself. An arm's
identity names its source files, its held-out split and, for encoded
arms under a subword tokenizer, the tokenizer: a run resumes only onto the same data, encoded alike.

Every arm is cut into chunks of `block_size + 1` tokens (stride `block_size`). An epoch visits the
chunks in a permutation that is a pure function of (seed, arm name, epoch), and an arm's whole
position is its cursor (epoch, position). So the data state of a run is a handful of integers, and
nothing about the order depends on what happened before: a resumed run draws exactly the chunks
the uninterrupted run would have drawn.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from andrea.daemon.config import DEFAULT_MAX_DOCUMENT_BYTES, ArmSpec, DataConfig
from andrea.daemon.data import heldout, tokencache
from andrea.daemon.data.compression import sampled
from andrea.daemon.data.encoding import Document, split_paths, write_arm
from andrea.daemon.data.encoding_progress import EncodingProgress
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.data.kinds.registry import ArmKind, Reading, Source
from andrea.daemon.data.livefiles import TokenFile, guard_arm
from andrea.daemon.data.sources import DataError, Meter, SourceRejected, Stop
from andrea.daemon.data.tokenizer import (
    BYTES,
    RunTokenizer,
    check_vocab,
    load_tokenizer,
    tokenizer_identity,
)
from andrea.daemon.rundir.durable import atomic_write_bytes

log = logging.getLogger(__name__)

ORDER_RULE = "argsort(PCG64(SeedSequence([seed, crc32(name), epoch])).random_raw(n_chunks), stable)"
#: Told apart from a permutation's seed words: an epoch's shift is drawn from its own stream.
_SHIFT_KEY = 0x5348
#: Under `[data] windows = "shifted"`: the order, and where each epoch's windows start.
SHIFTED_RULE = (
    f"{ORDER_RULE}; windows from PCG64(SeedSequence([seed, crc32(name), epoch, "
    f"{_SHIFT_KEY:#x}])).random_raw(1) mod block_size"
)


@dataclass(frozen=True)
class Arm:
    """One data source, materialised. With a held-out split, `tokens` is what training may see
    and `heldout` the documents it never does; `identity` then names the split too."""

    name: str
    identity: str
    tokens: np.ndarray | heldout.Spliced | TokenFile  # 1-D, read-only (livefiles.py)
    heldout: np.ndarray | heldout.Spliced | TokenFile | None = None
    documents: int | None = None
    documents_held_out: int | None = None
    #: The held-out file of a tokens arm (`heldout_path`), for the log.
    heldout_file: str | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])


def cache_root(cfg: DataConfig, base: Path) -> Path:
    """The token cache: `[data] cache_dir`, relative to the run directory `base` (under systemd
    the working directory is `/`); else systemd's CacheDirectory=, else the user's cache."""
    if cfg.cache_dir:
        return base / Path(cfg.cache_dir).expanduser()
    if os.environ.get("CACHE_DIRECTORY"):  # set by systemd's CacheDirectory=
        return Path(os.environ["CACHE_DIRECTORY"].split(":")[0])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "andrea"


def _load_tokens(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _log_split(arm: Arm, fraction: float) -> None:
    if arm.heldout_file is not None and arm.heldout is not None:
        log.info(
            "arm %s: %s training tokens, %s held out from its own file %s",
            arm.name,
            f"{arm.n_tokens:,}",
            f"{arm.heldout.shape[0]:,}",
            arm.heldout_file,
        )
        return
    log.info(
        "arm %s: %s of %s documents held out (fraction %g): %s training tokens, %s held out",
        arm.name,
        arm.documents_held_out if arm.documents_held_out is not None else "?",
        arm.documents if arm.documents is not None else "?",
        fraction,
        f"{arm.n_tokens:,}",
        f"{arm.heldout.shape[0]:,}" if arm.heldout is not None else 0,
    )
    if not arm.documents_held_out:
        log.warning(
            "arm %s is too small to hold anything out: none of its %s documents falls in the "
            "held-out fraction %g, so it has no held-out evaluation; give it more documents (a "
            "token file's are spans of %s tokens), or a larger [data] heldout_fraction",
            arm.name,
            arm.documents if arm.documents is not None else "?",
            fraction,
            f"{heldout.TOKEN_SPAN:,}",
        )


def encoded_identity(base: str, tokenizer: str, fraction: float | None) -> str:
    """The identity of an arm's tokens from its sources' identity `base`, the identity of the
    tokenizer that encodes them (the byte-level one adds nothing: the identities runs had before
    tokenizers existed) and the held-out split."""
    if tokenizer != BYTES:
        base = hashlib.sha256(f"{base}\0tokenizer\0{tokenizer}".encode()).hexdigest()
    return heldout.split_identity(base, fraction) if fraction else base


def _arm(
    spec: ArmSpec,
    kind: ArmKind,
    reading: Reading,
    cache: Path,
    cfg: DataConfig,
    tokenizer: RunTokenizer,
    progress: EncodingProgress,
) -> Arm:
    """An arm of an encoded kind from its cache entry, verified first (daemon/data/tokencache.py);
    encoded from the kind's documents when there is none or it is damaged. Processes sharing the
    cache verify an entry together and encode it one at a time (the entry's lock)."""
    name, should_stop, fraction = spec.name, reading.should_stop, cfg.heldout_fraction
    with _naming(spec):
        kind.before_identity(spec, reading)
        identity = encoded_identity(
            kind.source_identity(spec, reading), tokenizer.identity, fraction
        )
    with tokencache.entry_lock(cache, identity, name, should_stop, exclusive=False):
        record = tokencache.verified(cache, identity, tokenizer, should_stop, repair=False)
    if record is None:
        with tokencache.entry_lock(cache, identity, name, should_stop, exclusive=True):
            # Another process may have encoded it meanwhile; a damaged entry is removed here.
            record = tokencache.verified(cache, identity, tokenizer, should_stop)
            if record is None:
                source = kind.source(spec, reading)
                record = _encode(
                    name, cache, identity, source, tokenizer, fraction, should_stop, progress
                )
    train_path, held_path = split_paths(cache, identity, tokenizer.suffix)
    dtype = tokenizer.dtype
    if record.documents_held_out is None:
        return Arm(name, identity, _load_tokens(train_path, dtype))
    return Arm(
        name,
        identity,
        _load_tokens(train_path, dtype),
        _load_tokens(held_path, dtype),
        record.documents,
        record.documents_held_out,
    )


def _encode(
    name: str,
    cache: Path,
    identity: str,
    source: Source,
    tokenizer: RunTokenizer,
    fraction: float | None,
    should_stop: Stop,
    progress: EncodingProgress,
) -> tokencache.EntryRecord:
    """Encode an arm into the cache, saying so: this is the one slow part of a first start."""
    log.info(
        "encoding arm %s with %s (once; cached in %s): %.1f MB",
        name,
        tokenizer.describe(),
        cache,
        source.total_bytes / 1e6,
    )
    docs, sample = sampled(source.docs, tokenizer)
    if sample is not None and (warning := sample.warning()):
        log.warning("arm %s: %s", name, warning)
    t0 = time.perf_counter()
    progress.start(name, source.total_bytes, source.meter)
    try:
        written = write_arm(
            cache, identity, docs, tokenizer, fraction, should_stop, progress.update, arm=name
        )
        record = tokencache.write_record(cache, identity, tokenizer, written)
    finally:
        progress.finish()
    log.info("arm %s encoded in %.1f s", name, time.perf_counter() - t0)
    return record


@contextlib.contextmanager
def _naming(spec: ArmSpec) -> Iterator[None]:
    """A file of the arm that cannot be read as a regular file is refused naming the arm too."""
    try:
        yield
    except SourceRejected as e:
        raise SourceRejected(f"arm {spec.name!r}: {e}") from None


def arm_documents(
    spec: ArmSpec,
    base: Path,
    should_stop: Stop = None,
    bound: int = DEFAULT_MAX_DOCUMENT_BYTES,
    meter: Meter | None = None,
    shared: dict[str, Any] | None = None,
) -> Iterable[Document]:
    """The documents of an arm whose text the run's tokenizer encodes, `(id, text)` in order: the
    unit of the held-out split (ValueError for an arm of ids). `bound`: the longest document read,
    a JSON Lines line or a text file (`[data] max_document_bytes`); `meter`: counts the bytes
    read from the arm's files; `shared`: what the arms read one after the other share (the
    standard library's documents, extracted once for its three parts)."""
    reading = Reading(base, bound, should_stop, meter, {} if shared is None else shared)
    return kinds.kind(spec.kind).documents(spec, reading)


def describe_tokenizer(identity: str) -> str:
    """A tokenizer's identity in a refusal: "bytes", or the head of its sha256."""
    return BYTES if identity == BYTES else f"sha256 {identity[:12]}…"


def _unknown_makers(
    cfg: DataConfig, base: Path, run_tokenizer: str, only: str | None = None
) -> list[tuple[ArmSpec, str, Path]]:
    """`check_tokenizers`, and the file each unknown maker's warning is about."""
    unknown: list[tuple[ArmSpec, str, Path]] = []
    foreign: list[str] = []
    for spec in cfg.arms:
        made = kinds.kind(spec.kind).made_by(spec, base)
        if made is None or only not in (None, spec.name):
            continue
        if made.identity is None:
            unknown.append(
                (
                    spec,
                    f"arm {spec.name!r}: which tokenizer made {spec.path} is unknown "
                    f"({made.where}); its ids are read as the run's tokenizer's "
                    f"({describe_tokenizer(run_tokenizer)}); write its record to say "
                    "(docs/data.md, `Which tokenizer made a tokens arm`)",
                    made.file,
                )
            )
        elif made.identity != run_tokenizer:
            foreign.append(f"{spec.name!r} by {describe_tokenizer(made.identity)} ({made.where})")
    if foreign:
        own = [s.name for s in cfg.arms if s.encoded] or ["none"]
        raise DataError(
            "the arms come from different tokenizers: arm "
            + ", arm ".join(foreign)
            + f"; the run's [data] tokenizer = {cfg.tokenizer!r} is "
            + describe_tokenizer(run_tokenizer)
            + f" (it encodes the arms {', '.join(own)}). Ids of two tokenizers would share one "
            "embedding table: encode every arm with one tokenizer (andreactl tokenizer encode), or "
            "set [data] tokenizer to the one that made them"
        )
    return unknown


def check_tokenizers(
    cfg: DataConfig, base: Path, run_tokenizer: str, only: str | None = None
) -> list[tuple[ArmSpec, str]]:
    """Refuse a run whose arms come from different tokenizers (DataError naming the arms); the
    arms of ids whose tokenizer is unknown, accepted (the caller warns). `only`: check that arm."""
    return [(s, w) for s, w, _ in _unknown_makers(cfg, base, run_tokenizer, only)]


def load_arms(
    cfg: DataConfig,
    base: Path,
    vocab_size: int,
    should_stop: Callable[[], bool] | None = None,
    tokenizer: RunTokenizer | None = None,
    progress: EncodingProgress | None = None,
) -> list[Arm]:
    """Materialise every configured arm, in config order, encoded with `tokenizer` (default: the
    one `cfg` names), reporting an encoding's progress to `progress`. Raises DataError with the
    arm named (SourceRejected for a file that is not a regular file's content), TokenizerError
    for a vocabulary smaller than the tokenizer's, InterruptedError when a stop is requested
    meanwhile, and OSError naming the cache directory when the cache cannot be written."""
    tokenizer = tokenizer or load_tokenizer(cfg.tokenizer, base)
    check_vocab(vocab_size, tokenizer, any(s.encoded for s in cfg.arms))
    unknown = _unknown_makers(cfg, base, tokenizer.identity)
    progress = progress or EncodingProgress()
    cache = cache_root(cfg, base)
    cache.mkdir(parents=True, exist_ok=True)
    tokencache.remove_stale_temporaries(cache)
    reading = Reading(base, cfg.document_bound, should_stop)
    arms = []
    for s in cfg.arms:
        kind = kinds.kind(s.kind)
        if kind.encoded:
            arm = _arm(s, kind, reading, cache, cfg, tokenizer, progress)
        else:
            arm = kind.load(s, cfg, base, cache, vocab_size, tokenizer.identity)
        # Read by pread from here on: a file changed under the live run is an error, not a SIGBUS.
        arms.append(guard_arm(arm, vocab_size, not kind.encoded))
    if cfg.heldout_fraction:
        for arm in arms:
            _log_split(arm, cfg.heldout_fraction)
    for _, warning, file in unknown:
        _warn_once(cache, warning, file)
    for s in cfg.arms:
        for warning, file in kinds.kind(s.kind).notes(s, cfg, base):
            _warn_once(cache, warning, file)
    return arms


def _warn_once(cache: Path, warning: str, file: Path) -> None:
    """Log a warning about a data file once, not at every start: a marker in the cache remembers
    it, by its text and the file's size and time (a file written again is warned about again).
    Later starts log it at INFO."""
    try:
        st = file.stat()
        key = f"{warning}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    except OSError:
        key = warning
    marker = cache / f"warned-{hashlib.sha256(key.encode()).hexdigest()[:24]}"
    if marker.exists():
        log.info("%s (warned at an earlier start)", warning)
        return
    log.warning("%s", warning)
    with contextlib.suppress(OSError):  # an unwritable cache warns again next time, no more
        atomic_write_bytes(marker, warning.encode())


def arm_identity(spec: ArmSpec, cfg: DataConfig, base: Path, vocab_size: int) -> str:
    """The identity `load_arms` gives this arm, without building its data: what the proxy needs
    to reconcile its arms. (It used to build the corpus too, at the same time as the trainer, which
    doubled the CPU time of a first start.) Raises DataError naming the arm, as load_arms does."""
    kind = kinds.kind(spec.kind)
    if not kind.encoded:
        tokenizer = tokenizer_identity(cfg.tokenizer, base)
        check_tokenizers(cfg, base, tokenizer, only=spec.name)
        cache = cache_root(cfg, base)
        cache.mkdir(parents=True, exist_ok=True)
        return kind.load(spec, cfg, base, cache, vocab_size, tokenizer).identity
    run_tokenizer = load_tokenizer(cfg.tokenizer, base)
    check_vocab(vocab_size, run_tokenizer, any(s.encoded for s in cfg.arms))
    with _naming(spec):
        source = kind.source_identity(spec, Reading(base, cfg.document_bound))
    return encoded_identity(source, run_tokenizer.identity, cfg.heldout_fraction)


class CursorState(BaseModel):
    """Where one arm's order stands; part of the checkpoint manifest."""

    model_config = ConfigDict(extra="forbid")
    name: str
    identity: str
    n_tokens: int
    n_chunks: int
    epoch: int
    position: int
    order: str = ORDER_RULE

    @model_validator(mode="after")
    def _in_range(self) -> CursorState:
        # A cursor past the end of its arm cannot be resumed: it makes the checkpoint damaged (the
        # previous one is used), not a data error on every restart.
        if self.n_chunks < 1 or self.n_tokens < 1 or self.epoch < 0:
            raise ValueError(f"arm {self.name!r}: empty arm or negative epoch in its cursor")
        if not 0 <= self.position < self.n_chunks:
            raise ValueError(
                f"arm {self.name!r}: cursor position {self.position} is outside its "
                f"{self.n_chunks} chunks"
            )
        return self


def too_few_tokens(name: str, n_tokens: int, chunk: int) -> str:
    """The refusal of an arm with fewer training tokens than one chunk (block_size + 1): the
    start's, and `--check`'s for an arm whose files hold no document."""
    return f"arm {name!r} has {n_tokens} training tokens, fewer than one chunk of {chunk}"


class ArmStream:
    """Deterministic, resumable batches of chunks from one arm.

    An epoch is a permutation of the arm's chunks: windows of block_size + 1 tokens, block_size
    apart. With `shifted` (`[data] windows = "shifted"`, new runs), each epoch's windows start at
    an offset of 0 to block_size - 1 tokens drawn for that epoch (at most one window fewer, so that
    the last one still fits): an arm repeated many times over is not seen as the same sequences
    every epoch, which a small arm is otherwise learnt by heart from (docs/data.md, "Training
    windows"). Without
    it (runs created before), every epoch cuts the same windows. The ids `next_chunks` returns
    name the epoch too (epoch * n_chunks + index), so that `tokens_of` can place them.
    """

    def __init__(self, arm: Arm, seed: int, block_size: int, shifted: bool = False) -> None:
        self.arm = arm
        self.seed = seed
        self.chunk = block_size + 1
        self.stride = block_size
        self.n_chunks = max(0, (arm.n_tokens - 1) // block_size)
        # An arm of under two windows has nowhere to shift to: it is cut as before.
        self.shifted = shifted and arm.n_tokens >= 2 * block_size
        if self.shifted:
            self.n_chunks = (arm.n_tokens - block_size) // block_size
        if self.n_chunks < 1:
            held = ""
            if arm.documents_held_out:
                held = (
                    f": [data] heldout_fraction holds out {arm.documents_held_out} of its "
                    f"{arm.documents} documents; lower heldout_fraction, or give the arm more data"
                )
            raise DataError(too_few_tokens(arm.name, arm.n_tokens, self.chunk) + held)
        self.epoch = 0
        self.position = 0
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)
        self._offsets = np.arange(self.chunk, dtype=np.int64)
        self._name_key = zlib.crc32(arm.name.encode())

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            ss = np.random.SeedSequence([self.seed, self._name_key, epoch])
            # Raw PCG64 output and a stable argsort: unlike Generator.permutation, neither may
            # change between numpy releases, so the data order is part of the format.
            keys = np.random.PCG64(ss).random_raw(self.n_chunks)
            self._perm = np.argsort(keys, kind="stable")
            self._perm_epoch = epoch
        return self._perm

    def next_chunks(self, count: int) -> np.ndarray:
        """The next `count` chunk ids (epoch * n_chunks + index), crossing into new epochs as
        needed."""
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            perm = self._permutation(self.epoch)
            take = min(count - filled, self.n_chunks - self.position)
            out[filled : filled + take] = (
                perm[self.position : self.position + take] + self.epoch * self.n_chunks
            )
            filled += take
            self.position += take
            if self.position == self.n_chunks:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def next_batch(self, batch_size: int) -> np.ndarray:
        """(batch_size, block_size + 1) int64 token ids: inputs are [:, :-1], targets [:, 1:]."""
        return self.tokens_of(self.next_chunks(batch_size))

    def tokens_of(self, chunks: np.ndarray) -> np.ndarray:
        """The (len(chunks), block_size + 1) int64 token ids of chunks drawn by `next_chunks`; reads
        only (the training step gathers a batch's tokens on another thread)."""
        epochs, index = np.divmod(chunks, self.n_chunks)
        starts = index * self.stride
        if self.shifted:
            for epoch in np.unique(epochs).tolist():
                starts[epochs == epoch] += self.shift(epoch)
        return self.arm.tokens[starts[:, None] + self._offsets].astype(np.int64)

    def shift(self, epoch: int) -> int:
        """Where `epoch`'s windows start (0 unless shifted): a draw of (seed, arm, epoch), from raw
        PCG64 output, as the permutation is, so that it is part of the format."""
        if not self.shifted:
            return 0
        ss = np.random.SeedSequence([self.seed, self._name_key, epoch, _SHIFT_KEY])
        return int(np.random.PCG64(ss).random_raw(1)[0] % np.uint64(self.stride))

    def state_dict(self) -> CursorState:
        return CursorState(
            name=self.arm.name,
            identity=self.arm.identity,
            n_tokens=self.arm.n_tokens,
            n_chunks=self.n_chunks,
            epoch=self.epoch,
            position=self.position,
            order=self.order_rule,
        )

    @property
    def order_rule(self) -> str:
        """The rule of its data order, as a checkpoint's cursor records it."""
        return SHIFTED_RULE if self.shifted else ORDER_RULE

    def load_state_dict(self, state: CursorState) -> None:
        if state.identity != self.arm.identity or state.n_chunks != self.n_chunks:
            raise DataError(
                f"arm {self.arm.name!r}: checkpoint cursor belongs to data {state.identity[:12]} "
                f"({state.n_chunks} chunks), this run has {self.arm.identity[:12]} ({self.n_chunks} chunks)"
            )
        if state.order != self.order_rule:
            raise DataError(
                f"arm {self.arm.name!r}: checkpoint cursor follows the order {state.order!r}, "
                f"this run {self.order_rule!r} ([data] windows)"
            )
        if not 0 <= state.position < self.n_chunks or state.epoch < 0:
            raise DataError(
                f"arm {self.arm.name!r}: cursor {state.epoch}:{state.position} out of range"
            )
        self.epoch, self.position = state.epoch, state.position


def counter_uniform(*key: int) -> float:
    """A uniform in [0, 1) that is a pure function of the integers in `key` (a counter-based draw:
    recomputing it after a restart needs no generator state)."""
    raw = np.random.PCG64(np.random.SeedSequence(list(key))).random_raw()
    return float(int(raw) >> 11) * 2.0**-53


class FixedMixture:
    """Chooses the arm of each step from fixed weights, as a pure function of (seed, step)."""

    _STREAM = 0x6D6978  # "mix": keeps these draws apart from any other use of the seed

    def __init__(self, names: list[str], weights: list[float], seed: int) -> None:
        w = np.asarray(weights, dtype=np.float64)
        self.names = names
        self.cdf = np.cumsum(w / w.sum())
        self.seed = seed

    def assign(self, step: int) -> int:
        u = counter_uniform(self.seed, self._STREAM, step)
        return min(int(np.searchsorted(self.cdf, u, side="right")), len(self.names) - 1)
