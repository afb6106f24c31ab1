"""Data arms: materialised token arrays, their identities, and a resumable order over each.

Tokens are bytes (a byte-level tokenizer: token = byte value, vocabulary 256, nothing to download)
for text arms; `tokens` arms are pre-tokenized flat files of uint8/16/32 ids, memory-mapped.

Every arm is cut into chunks of `block_size + 1` tokens (stride `block_size`). An epoch visits the
chunks in a permutation that is a pure function of (seed, arm name, epoch), and an arm's whole
position is its cursor (epoch, position). So the data state of a run is a handful of integers, and
nothing about the order depends on what happened before: a resumed run draws exactly the chunks
the uninterrupted run would have drawn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from glob import glob
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from . import corpus, heldout
from .config import ArmSpec, DataConfig
from .durable import atomic_write_bytes

log = logging.getLogger(__name__)

ORDER_RULE = "argsort(PCG64(SeedSequence([seed, crc32(name), epoch])).random_raw(n_chunks), stable)"


class DataError(RuntimeError):
    """A configured data source is missing, unreadable or unusable."""


@dataclass(frozen=True)
class Arm:
    """One data source, materialised. With a held-out split, `tokens` is what training may see
    and `heldout` the documents it never does; `identity` then names the split too."""

    name: str
    identity: str
    tokens: np.ndarray | heldout.Spliced  # 1-D, read-only (often a memmap)
    heldout: np.ndarray | heldout.Spliced | None = None
    documents: int | None = None
    documents_held_out: int | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])


def cache_root(cfg: DataConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    if os.environ.get("CACHE_DIRECTORY"):  # set by systemd's CacheDirectory=
        return Path(os.environ["CACHE_DIRECTORY"].split(":")[0])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "andrea"


def _load_u8(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r")


def _split_paths(cache: Path, identity: str, suffix: str = "u8") -> tuple[Path, Path]:
    return cache / f"{identity}.{suffix}", cache / f"{identity}.heldout.{suffix}"


def _log_split(arm: Arm, fraction: float) -> None:
    log.info(
        "arm %s: %s of %s documents held out (fraction %g): %s training tokens, %s held out",
        arm.name,
        arm.documents_held_out if arm.documents_held_out is not None else "?",
        arm.documents if arm.documents is not None else "?",
        fraction,
        f"{arm.n_tokens:,}",
        f"{arm.heldout.shape[0]:,}" if arm.heldout is not None else 0,
    )


def _write_split(
    cache: Path, identity: str, docs: list[tuple[str, bytes]], fraction: float
) -> None:
    train, held, n, n_held = heldout.split_documents(docs, fraction)
    train_path, held_path = _split_paths(cache, identity)
    atomic_write_bytes(held_path, held)
    atomic_write_bytes(cache / f"{identity}.docs.json", json.dumps([n, n_held]).encode())
    atomic_write_bytes(train_path, train)  # last: its presence says the split is complete


def _load_split(name: str, cache: Path, identity: str) -> Arm:
    train_path, held_path = _split_paths(cache, identity)
    n, n_held = json.loads((cache / f"{identity}.docs.json").read_text())
    return Arm(name, identity, _load_u8(train_path), _load_u8(held_path), n, n_held)


def _stdlib_arms(
    specs: list[ArmSpec],
    cache: Path,
    should_stop: Callable[[], bool] | None,
    fraction: float | None,
) -> dict[str, Arm]:
    root = corpus.stdlib_root()
    files = corpus.stdlib_files(root)
    if not files:
        raise DataError(f"no Python sources found under {root}")
    ids = {p: corpus.stdlib_identity(p, files, root) for p in corpus.PARTS}
    if fraction:
        ids = {p: heldout.split_identity(i, fraction) for p, i in ids.items()}
    missing = [p for p in corpus.PARTS if not (cache / f"{ids[p]}.u8").exists()]
    if missing:
        log.info(
            "building the default corpus from %d files under %s (once; cached in %s)",
            len(files),
            root,
            cache,
        )
        docs = corpus.extract_stdlib_documents(files, root, should_stop)
        for p in missing:
            if fraction:
                _write_split(cache, ids[p], docs[p], fraction)
            else:
                atomic_write_bytes(
                    cache / f"{ids[p]}.u8", heldout.DOC_SEPARATOR.join(d for _, d in docs[p])
                )
    if fraction:
        return {s.name: _load_split(s.name, cache, ids[s.part]) for s in specs}
    return {s.name: Arm(s.name, ids[s.part], _load_u8(cache / f"{ids[s.part]}.u8")) for s in specs}


def _text_files(spec: ArmSpec, base: Path) -> tuple[list[Path], Path]:
    """A text arm's files in a fixed order, and their common directory."""
    files = sorted(
        {
            Path(p)
            for pat in spec.paths
            for p in glob(str(base / pat), recursive=True)
            if Path(p).is_file()
        }
    )
    if not files:
        raise DataError(f"arm {spec.name!r}: no files match {spec.paths} (relative to {base})")
    return files, Path(os.path.commonpath([f.parent for f in files]))


def _text_arm(
    spec: ArmSpec,
    base: Path,
    cache: Path,
    should_stop: Callable[[], bool] | None,
    fraction: float | None,
) -> Arm:
    files, common = _text_files(spec, base)
    identity = corpus.listing_digest(files, common, "text:v1")
    if fraction:
        identity = heldout.split_identity(identity, fraction)
    path = cache / f"{identity}.u8"
    if not path.exists():
        docs = []
        for f in files:
            if should_stop is not None and should_stop():
                raise InterruptedError("stop requested while reading text arms")
            docs.append((f.relative_to(common).as_posix(), f.read_bytes()))
        if fraction:
            _write_split(cache, identity, docs, fraction)
        else:
            atomic_write_bytes(path, heldout.DOC_SEPARATOR.join(d for _, d in docs))
    if fraction:
        return _load_split(spec.name, cache, identity)
    return Arm(spec.name, identity, _load_u8(path))


def _tokens_arm(
    spec: ArmSpec, base: Path, cache: Path, vocab_size: int, fraction: float | None
) -> Arm:
    path = (base / spec.path).resolve()
    if not path.is_file():
        raise DataError(f"arm {spec.name!r}: token file {path} does not exist")
    dtype = np.dtype(spec.dtype).newbyteorder("<")
    st = path.stat()
    if st.st_size == 0:
        raise DataError(f"arm {spec.name!r}: token file {path} is empty")
    if st.st_size % dtype.itemsize:
        raise DataError(
            f"arm {spec.name!r}: {path} is {st.st_size} bytes, not a whole number of {spec.dtype}"
        )
    # Hashing a large token file takes a while: remember the digest per (path, size, mtime, inode).
    memo = cache / f"tokens-{hashlib.sha256(str(path).encode()).hexdigest()[:16]}.json"
    key = [st.st_size, st.st_mtime_ns, st.st_ino]
    if memo.exists() and (m := json.loads(memo.read_text())).get("key") == key:
        identity, max_id = m["identity"], m["max_id"]
    else:
        tokens = np.memmap(path, dtype=dtype, mode="r")
        h = hashlib.sha256(f"tokens:{spec.dtype}:v1".encode())
        max_id = 0
        step = 1 << 24
        for i in range(0, tokens.shape[0], step):
            block = tokens[i : i + step]
            h.update(block.tobytes())
            max_id = max(max_id, int(block.max(initial=0)))
        identity = h.hexdigest()
        atomic_write_bytes(
            memo, json.dumps({"key": key, "identity": identity, "max_id": max_id}).encode()
        )
    if max_id >= vocab_size:
        raise DataError(
            f"arm {spec.name!r}: token id {max_id} in {path} exceeds vocab_size {vocab_size}"
        )
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if not fraction:
        return Arm(spec.name, identity, tokens)
    kept, held = heldout.split_token_spans(tokens.shape[0], fraction)
    return Arm(
        spec.name,
        heldout.split_identity(identity, fraction),
        heldout.Spliced(tokens, kept),
        heldout.Spliced(tokens, held),
        len(kept) + len(held),
        len(held),
    )


def load_arms(
    cfg: DataConfig, base: Path, vocab_size: int, should_stop: Callable[[], bool] | None = None
) -> list[Arm]:
    """Materialise every configured arm, in config order. Raises DataError with the arm named."""
    cache = cache_root(cfg)
    cache.mkdir(parents=True, exist_ok=True)
    fraction = cfg.heldout_fraction
    stdlib = [s for s in cfg.arms if s.kind == "stdlib"]
    byname = _stdlib_arms(stdlib, cache, should_stop, fraction) if stdlib else {}
    if any(s.kind in ("stdlib", "text") for s in cfg.arms) and vocab_size < 256:
        raise DataError(f"byte-level text arms need vocab_size >= 256, the model has {vocab_size}")
    for s in cfg.arms:
        if s.kind == "text":
            byname[s.name] = _text_arm(s, base, cache, should_stop, fraction)
        elif s.kind == "tokens":
            byname[s.name] = _tokens_arm(s, base, cache, vocab_size, fraction)
    arms = [byname[s.name] for s in cfg.arms]
    if fraction:
        for arm in arms:
            _log_split(arm, fraction)
    return arms


def arm_identity(spec: ArmSpec, cfg: DataConfig, base: Path, vocab_size: int) -> str:
    """The identity `load_arms` gives this arm, without building its data: what the proxy needs
    to reconcile its arms. (It used to build the corpus too, at the same time as the trainer, which
    doubled the CPU time of a first start.) Raises DataError naming the arm, as load_arms does."""
    if spec.kind in ("stdlib", "text") and vocab_size < 256:
        raise DataError(f"byte-level text arms need vocab_size >= 256, the model has {vocab_size}")
    fraction = cfg.heldout_fraction
    if spec.kind == "stdlib":
        root = corpus.stdlib_root()
        files = corpus.stdlib_files(root)
        if not files:
            raise DataError(f"no Python sources found under {root}")
        identity = corpus.stdlib_identity(spec.part, files, root)
    elif spec.kind == "text":
        files, common = _text_files(spec, base)
        identity = corpus.listing_digest(files, common, "text:v1")
    else:
        cache = cache_root(cfg)
        cache.mkdir(parents=True, exist_ok=True)
        return _tokens_arm(spec, base, cache, vocab_size, fraction).identity
    return heldout.split_identity(identity, fraction) if fraction else identity


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


class ArmStream:
    """Deterministic, resumable batches of chunks from one arm."""

    def __init__(self, arm: Arm, seed: int, block_size: int) -> None:
        self.arm = arm
        self.seed = seed
        self.chunk = block_size + 1
        self.stride = block_size
        self.n_chunks = max(0, (arm.n_tokens - 1) // block_size)
        if self.n_chunks < 1:
            raise DataError(
                f"arm {arm.name!r} has {arm.n_tokens} tokens, fewer than one chunk of {self.chunk}"
            )
        self.epoch = 0
        self.position = 0
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)
        self._offsets = np.arange(self.chunk, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            ss = np.random.SeedSequence([self.seed, zlib.crc32(self.arm.name.encode()), epoch])
            # Raw PCG64 output and a stable argsort: unlike Generator.permutation, neither may
            # change between numpy releases, so the data order is part of the format.
            keys = np.random.PCG64(ss).random_raw(self.n_chunks)
            self._perm = np.argsort(keys, kind="stable")
            self._perm_epoch = epoch
        return self._perm

    def next_chunks(self, count: int) -> np.ndarray:
        """The next `count` chunk indices, crossing into new epochs as needed."""
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            perm = self._permutation(self.epoch)
            take = min(count - filled, self.n_chunks - self.position)
            out[filled : filled + take] = perm[self.position : self.position + take]
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
        return self.arm.tokens[(chunks * self.stride)[:, None] + self._offsets].astype(np.int64)

    def state_dict(self) -> CursorState:
        return CursorState(
            name=self.arm.name,
            identity=self.arm.identity,
            n_tokens=self.arm.n_tokens,
            n_chunks=self.n_chunks,
            epoch=self.epoch,
            position=self.position,
        )

    def load_state_dict(self, state: CursorState) -> None:
        if state.identity != self.arm.identity or state.n_chunks != self.n_chunks:
            raise DataError(
                f"arm {self.arm.name!r}: checkpoint cursor belongs to data {state.identity[:12]} "
                f"({state.n_chunks} chunks), this run has {self.arm.identity[:12]} ({self.n_chunks} chunks)"
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
