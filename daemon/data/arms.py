"""Data arms: materialised token arrays, their identities, and a resumable order over each.

The text of `stdlib`, `text`, `jsonl` and `parquet` arms is encoded with the run's tokenizer
(daemon/data/tokenizer.py: bytes by default, or a subword `tokenizer.json`) once, and cached under
its identity; `tokens` arms
are pre-tokenized flat files of uint8/16/32 ids, memory-mapped, that say which tokenizer made them
(daemon/data/encoding.py). An arm's identity names its source files, its held-out split and, for encoded
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
import json
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from andrea.daemon.config import DEFAULT_MAX_DOCUMENT_BYTES, FILE_KINDS, ArmSpec, DataConfig
from andrea.daemon.data import corpus, heldout, tokencache
from andrea.daemon.data.compression import sampled
from andrea.daemon.data.encoding import Document, read_record, split_paths, write_arm
from andrea.daemon.data.encoding_progress import EncodingProgress
from andrea.daemon.data.livefiles import TokenFile, guard_arm
from andrea.daemon.data.nanogpt_meta import META_NAME, MetaRefused, read_meta, tokenizer_json
from andrea.daemon.data.parquet import parquet_documents
from andrea.daemon.data.sources import (
    DEFAULT_FIELD,
    DataError,
    Meter,
    SourceRejected,
    Stop,
    arm_files,
    arm_roots,
    jsonl_documents,
    oversize_text,
    text_documents,
)
from andrea.daemon.data.token_files import (
    TokenLayout,
    llmc_header,
    open_token_file,
    validation_sibling,
)
from andrea.daemon.data.tokenizer import (
    BYTES,
    RunTokenizer,
    check_vocab,
    load_tokenizer,
    tokenizer_identity,
)
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes

log = logging.getLogger(__name__)

ORDER_RULE = "argsort(PCG64(SeedSequence([seed, crc32(name), epoch])).random_raw(n_chunks), stable)"


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


@dataclass(frozen=True)
class _Source:
    """An arm's documents to encode, how many bytes of files they come from, and what counts the
    bytes read (None: the documents are in memory, their own bytes are counted)."""

    docs: Iterable[Document]
    total_bytes: int
    meter: Meter | None = None


def _arm(
    name: str,
    cache: Path,
    identity: str,
    tokenizer: RunTokenizer,
    source: Callable[[], _Source],
    fraction: float | None,
    should_stop: Stop,
    progress: EncodingProgress,
) -> Arm:
    """An encoded arm from its cache entry, verified first (daemon/data/tokencache.py); encoded from
    `source()` when there is none or it is damaged. Processes sharing the cache verify an entry
    together and encode it one at a time (the entry's lock)."""
    with tokencache.entry_lock(cache, identity, name, should_stop, exclusive=False):
        record = tokencache.verified(cache, identity, tokenizer, should_stop, repair=False)
    if record is None:
        with tokencache.entry_lock(cache, identity, name, should_stop, exclusive=True):
            # Another process may have encoded it meanwhile; a damaged entry is removed here.
            record = tokencache.verified(cache, identity, tokenizer, should_stop)
            if record is None:
                record = _encode(
                    name, cache, identity, source(), tokenizer, fraction, should_stop, progress
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
    source: _Source,
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


def _stdlib_arms(
    specs: list[ArmSpec],
    cache: Path,
    should_stop: Stop,
    fraction: float | None,
    tokenizer: RunTokenizer,
    progress: EncodingProgress,
) -> dict[str, Arm]:
    root = corpus.stdlib_root()
    files = corpus.stdlib_files(root)
    if not files:
        raise DataError(f"no Python sources found under {root}")
    parts = sorted({s.part for s in specs if s.part is not None})
    ids = {
        p: encoded_identity(source, tokenizer.identity, fraction)
        for p, source in corpus.stdlib_identities(parts, files, root).items()
    }
    extracted: dict[str, list[tuple[str, bytes]]] = {}

    def source(part: str) -> Callable[[], _Source]:
        def documents() -> _Source:
            if not extracted:  # once, for every part that needs encoding
                log.info(
                    "building the default corpus from %d files under %s (once; cached in %s)",
                    len(files),
                    root,
                    cache,
                )
                extracted.update(corpus.extract_stdlib_documents(files, root, should_stop))
            return _Source(extracted[part], sum(len(d) for _, d in extracted[part]))

        return documents

    return {
        s.name: _arm(
            s.name,
            cache,
            ids[s.part],
            tokenizer,
            source(s.part),
            fraction,
            should_stop,
            progress,
        )
        for s in specs
        if s.part is not None
    }


def _source_identity(spec: ArmSpec, base: Path, should_stop: Stop = None) -> tuple[str, Path]:
    """The identity of a text, jsonl or parquet arm's files (their listing, sizes and contents),
    and their common directory."""
    files, common = arm_files(spec, base)
    salt = "text:v1" if spec.kind == "text" else f"{spec.kind}:v1:{spec.field or DEFAULT_FIELD}"
    inside = arm_roots(spec, base)
    return corpus.listing_digest(files, common, salt, should_stop, inside), common


def _file_arm(
    spec: ArmSpec,
    base: Path,
    cache: Path,
    cfg: DataConfig,
    tokenizer: RunTokenizer,
    should_stop: Stop,
    progress: EncodingProgress,
) -> Arm:
    """A text, JSON Lines or Parquet arm."""

    def source() -> _Source:
        files, _ = arm_files(spec, base)
        meter = Meter()
        docs = arm_documents(spec, base, should_stop, bound=cfg.document_bound, meter=meter)
        return _Source(docs, sum(f.stat().st_size for f in files), meter)

    fraction = cfg.heldout_fraction
    with _naming(spec):
        if spec.kind == "text":
            # Before the files are hashed (gigabytes take minutes): a document over the bound is
            # refused at once (read_file checks again, should the file grow meanwhile).
            _check_sizes(spec, arm_files(spec, base)[0], cfg.document_bound)
        digest, _ = _source_identity(spec, base, should_stop)
        identity = encoded_identity(digest, tokenizer.identity, fraction)
        return _arm(spec.name, cache, identity, tokenizer, source, fraction, should_stop, progress)


def _check_sizes(spec: ArmSpec, files: list[Path], bound: int) -> None:
    """A text arm's file is one document: one over `bound` bytes is a DataError naming both."""
    for f in files:
        if (size := f.stat().st_size) > bound:
            raise DataError(oversize_text(f"arm {spec.name!r}: ", f, size, bound))


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
    stdlib: dict[str, list[tuple[str, bytes]]] | None = None,
    bound: int = DEFAULT_MAX_DOCUMENT_BYTES,
    meter: Meter | None = None,
) -> Iterable[Document]:
    """The documents of an arm whose text the run's tokenizer encodes, `(id, text)` in order: the
    unit of the held-out split. `stdlib`: the embedded corpus's documents, when they were
    extracted already (for another arm); `bound`: the longest document read, a JSON Lines line
    or a text file (`[data] max_document_bytes`); `meter`: counts the bytes read from the arm's files."""
    if spec.kind == "stdlib":
        if stdlib is None:
            root = corpus.stdlib_root()
            stdlib = corpus.extract_stdlib_documents(corpus.stdlib_files(root), root, should_stop)
        return stdlib[spec.part or ""]
    if spec.kind == "tokens":
        raise ValueError(f"arm {spec.name!r} is a tokens file: it holds ids, not documents")
    files, common = arm_files(spec, base)
    inside = arm_roots(spec, base)
    label = f"arm {spec.name!r}: "
    if spec.kind == "text":
        return text_documents(files, common, should_stop, inside, meter, bound, label)
    field = spec.field or DEFAULT_FIELD
    read = parquet_documents if spec.kind == "parquet" else jsonl_documents
    return read(files, common, field, should_stop, label, inside, bound, meter)


def _tokens_file(spec: ArmSpec, base: Path, held_out: bool = False) -> TokenLayout:
    """A tokens arm's file (its held-out file with `held_out`), opened by what says its ids'
    type (daemon/data/token_files.py)."""
    named = base / (spec.heldout_path if held_out and spec.heldout_path else spec.tokens_path())
    record = read_record(named)
    return open_token_file(
        f"arm {spec.name!r}",
        named.resolve(),
        spec.dtype,
        record.dtype if record is not None else None,
        named,
        "held-out token file" if held_out else "token file",
    )


def _made_by(spec: ArmSpec, base: Path) -> tuple[str | None, str]:
    """Which tokenizer made a tokens arm's file: its record's identity (None: unknown), and where
    that is said. The record is the one beside the path the arm names (a link's own, not its
    target's: whoever links a file from elsewhere says, beside the link, what made it); without
    one, a nanoGPT meta.pkl beside it says (its vocabulary is a tokenizer)."""
    path = base / spec.tokens_path()
    record = read_record(path)
    if record is not None:
        return record.tokenizer, f"per {path.name}.json"
    meta = path.parent / META_NAME
    if meta.is_file():
        try:
            made_by = hashlib.sha256(tokenizer_json(read_meta(meta))).hexdigest()
        except MetaRefused as e:
            raise SourceRejected(f"arm {spec.name!r}: {e}") from None
        return (
            made_by,
            f"per nanoGPT's {META_NAME} beside it ([data] tokenizer = {_beside(spec)!r})",
        )
    head = llmc_header(path, path.stat().st_size) if path.is_file() else None
    if head is not None:
        family = "GPT-2's" if head[0] == 20240520 else "Llama 3's"
        return None, (
            f"llm.c's header, magic {head[0]}, says {family} ids: set [data] tokenizer to that "
            "tokenizer.json to decode them"
        )
    return None, f"no {path.name}.json beside it"


def _beside(spec: ArmSpec) -> str:
    """The meta.pkl beside a tokens arm's file, as [data] tokenizer names it."""
    return str(Path(spec.tokens_path()).parent / META_NAME)


def _describe_tokenizer(identity: str) -> str:
    return BYTES if identity == BYTES else f"sha256 {identity[:12]}…"


def check_tokenizers(
    cfg: DataConfig, base: Path, run_tokenizer: str, only: str | None = None
) -> list[tuple[ArmSpec, str]]:
    """Refuse a run whose arms come from different tokenizers (DataError naming the arms); the
    tokens arms whose tokenizer is unknown, accepted (the caller warns). `only`: check that arm."""
    unknown: list[tuple[ArmSpec, str]] = []
    foreign: list[str] = []
    for spec in cfg.arms:
        if spec.kind != "tokens" or only not in (None, spec.name):
            continue
        made_by, where = _made_by(spec, base)
        if made_by is None:
            unknown.append(
                (
                    spec,
                    f"arm {spec.name!r}: which tokenizer made {spec.path} is unknown ({where}); its ids "
                    f"are read as the run's tokenizer's ({_describe_tokenizer(run_tokenizer)}); "
                    "write its record to say (docs/data.md, `Which tokenizer made a tokens arm`)",
                )
            )
        elif made_by != run_tokenizer:
            foreign.append(f"{spec.name!r} by {_describe_tokenizer(made_by)} ({where})")
    if foreign:
        own = [s.name for s in cfg.arms if s.encoded] or ["none"]
        raise DataError(
            "the arms come from different tokenizers: arm "
            + ", arm ".join(foreign)
            + f"; the run's [data] tokenizer = {cfg.tokenizer!r} is "
            + _describe_tokenizer(run_tokenizer)
            + f" (it encodes the arms {', '.join(own)}). Ids of two tokenizers would share one "
            "embedding table: encode every arm with one tokenizer (andreactl tokenizer encode), or "
            "set [data] tokenizer to the one that made them"
        )
    return unknown


class _TokensMemo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: list[int]
    identity: str
    max_id: int


def _memo(path: Path) -> _TokensMemo | None:
    """A token file's remembered identity; None when there is none or it is damaged (it is then
    computed again, and the memo rewritten)."""
    try:
        return _TokensMemo.model_validate_json(read_bounded(path, 1 << 16))
    except FileNotFoundError:
        return None
    except (OSError, FileRejected, ValueError) as e:
        log.warning("token cache: %s is damaged (%s); hashing the file again", path, e)
        return None


def _tokens_identity(file: TokenLayout, cache: Path, arm: str) -> tuple[str, int]:
    """A token file's identity (a hash of its ids) and largest id; both remembered per (path,
    size, mtime, inode, id width, header), since hashing a large file takes a while. `arm`: the
    arm's name, for a wait on the memo's lock."""
    st = file.path.stat()
    memo = cache / f"tokens-{hashlib.sha256(str(file.path).encode()).hexdigest()[:16]}.json"
    key = [st.st_size, st.st_mtime_ns, st.st_ino, file.dtype.itemsize, file.offset]
    remembered = _memo(memo)
    if remembered is not None and remembered.key == key:
        return remembered.identity, remembered.max_id
    tokens = file.tokens()
    h = hashlib.sha256(f"tokens:{file.dtype.name}:v1".encode())
    max_id = 0
    step = 1 << 24
    for i in range(0, tokens.shape[0], step):
        block = tokens[i : i + step]
        h.update(block.tobytes())
        max_id = max(max_id, int(block.max(initial=0)))
    identity = h.hexdigest()
    # Under the memo's own lock, as every temporary of the cache is written: a start that finds
    # the lock free takes the temporary for one a killed writer left (remove_stale_temporaries).
    with tokencache.entry_lock(cache, memo.stem, arm, exclusive=True):
        atomic_write_bytes(
            memo, json.dumps({"key": key, "identity": identity, "max_id": max_id}).encode()
        )
    return identity, max_id


def _checked_identity(
    spec: ArmSpec, file: TokenLayout, cache: Path, vocab_size: int, tokenizer: str
) -> str:
    identity, max_id = _tokens_identity(file, cache, spec.name)
    if max_id >= vocab_size:
        raise DataError(
            f"arm {spec.name!r}: token id {max_id:,} in {file.path} is not below [model] "
            f"vocab_size {vocab_size:,}: set [model] vocab_size to at least {max_id + 1:,}, or "
            "[data] tokenizer to the tokenizer that made the file (the run's is "
            f"{_describe_tokenizer(tokenizer)}; its size is the default vocab_size)"
        )
    return identity


def _tokens_arm(
    spec: ArmSpec,
    base: Path,
    cache: Path,
    vocab_size: int,
    fraction: float | None,
    tokenizer: str,
) -> Arm:
    """A tokens arm: its file's ids; held out, its `heldout_path` file (nanoGPT's val.bin), else
    `fraction` of its spans of `heldout.TOKEN_SPAN` tokens (none without a fraction)."""
    train = _tokens_file(spec, base)
    identity = _checked_identity(spec, train, cache, vocab_size, tokenizer)
    tokens = train.tokens()
    if not fraction:
        return Arm(spec.name, identity, tokens)
    if spec.heldout_path is not None:
        held = _tokens_file(spec, base, held_out=True)
        held_identity = _checked_identity(spec, held, cache, vocab_size, tokenizer)
        return Arm(
            spec.name,
            hashlib.sha256(f"{identity}\0heldout file\0{held_identity}".encode()).hexdigest(),
            tokens,
            held.tokens(),
            heldout_file=f"{spec.heldout_path} ({held.said_by})",
        )
    kept, held_spans = heldout.split_token_spans(tokens.shape[0], fraction)
    return Arm(
        spec.name,
        heldout.split_identity(identity, fraction),
        heldout.Spliced(tokens, kept),
        heldout.Spliced(tokens, held_spans),
        len(kept) + len(held_spans),
        len(held_spans),
    )


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
    unknown = check_tokenizers(cfg, base, tokenizer.identity)
    progress = progress or EncodingProgress()
    cache = cache_root(cfg, base)
    cache.mkdir(parents=True, exist_ok=True)
    tokencache.remove_stale_temporaries(cache)
    fraction = cfg.heldout_fraction
    stdlib = [s for s in cfg.arms if s.kind == "stdlib"]
    byname = (
        _stdlib_arms(stdlib, cache, should_stop, fraction, tokenizer, progress) if stdlib else {}
    )
    for s in cfg.arms:
        if s.kind in FILE_KINDS:
            byname[s.name] = _file_arm(s, base, cache, cfg, tokenizer, should_stop, progress)
        elif s.kind == "tokens":
            byname[s.name] = _tokens_arm(s, base, cache, vocab_size, fraction, tokenizer.identity)
    # Read by pread from here on: a file changed under the live run is an error, not a SIGBUS.
    arms = [guard_arm(byname[s.name], vocab_size, s.kind == "tokens") for s in cfg.arms]
    if fraction:
        for arm in arms:
            _log_split(arm, fraction)
    _warn_tokens_files(cfg, base, cache, unknown)
    return arms


def _warn_tokens_files(
    cfg: DataConfig, base: Path, cache: Path, unknown: list[tuple[ArmSpec, str]]
) -> None:
    """Once the arms are loaded: which tokens arms come from an unknown tokenizer, and which
    leave a val.bin beside them unused, each said once (`_warn_once`)."""
    for spec, warning in unknown:
        _warn_once(cache, warning, base / spec.tokens_path())
    for spec in cfg.arms:
        if spec.kind != "tokens" or spec.heldout_path is not None or not cfg.heldout_fraction:
            continue
        sibling = validation_sibling(base / spec.tokens_path())
        if sibling is not None:
            _warn_once(
                cache,
                f"arm {spec.name!r}: {sibling.name} lies beside {spec.tokens_path()}, and spans "
                f"of {spec.tokens_path()} are held out instead: set heldout_path = "
                f"{str(Path(spec.tokens_path()).with_name(sibling.name))!r} in the arm to "
                "evaluate on it (before the run's first checkpoint: it changes the arm's data)",
                sibling,
            )


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
    fraction = cfg.heldout_fraction
    if spec.kind == "tokens":
        tokenizer = tokenizer_identity(cfg.tokenizer, base)
        check_tokenizers(cfg, base, tokenizer, only=spec.name)
        cache = cache_root(cfg, base)
        cache.mkdir(parents=True, exist_ok=True)
        return _tokens_arm(spec, base, cache, vocab_size, fraction, tokenizer).identity
    run_tokenizer = load_tokenizer(cfg.tokenizer, base)
    check_vocab(vocab_size, run_tokenizer, any(s.encoded for s in cfg.arms))
    if spec.kind == "stdlib":
        root = corpus.stdlib_root()
        files = corpus.stdlib_files(root)
        if not files:
            raise DataError(f"no Python sources found under {root}")
        source = corpus.stdlib_identity(spec.stdlib_part(), files, root)
    else:
        with _naming(spec):
            source, _ = _source_identity(spec, base)
    return encoded_identity(source, run_tokenizer.identity, fraction)


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
    """Deterministic, resumable batches of chunks from one arm."""

    def __init__(self, arm: Arm, seed: int, block_size: int) -> None:
        self.arm = arm
        self.seed = seed
        self.chunk = block_size + 1
        self.stride = block_size
        self.n_chunks = max(0, (arm.n_tokens - 1) // block_size)
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
