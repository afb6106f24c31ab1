"""`kind = "tokens"`: a pre-tokenized flat binary file of unsigned integers, memory-mapped:
andrea's, nanoGPT's ``train.bin`` or llm.c's ``.bin`` (daemon/data/token_files.py), which says
which tokenizer made it (its record FILE.json, a nanoGPT meta.pkl beside it). Its ids are not
encoded again: its identity is a hash of its ids, and its held-out data spans of them, or its
own file (``heldout_path``, nanoGPT's ``val.bin``)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from andrea.daemon.config import ArmSpec, DataConfig
from andrea.daemon.data import heldout, tokencache
from andrea.daemon.data.arms import Arm, describe_tokenizer
from andrea.daemon.data.encoding import read_record
from andrea.daemon.data.kinds.registry import ArmKind, Maker, register
from andrea.daemon.data.nanogpt_meta import META_NAME, MetaRefused, read_meta, tokenizer_json
from andrea.daemon.data.sources import DataError, SourceRejected
from andrea.daemon.data.token_files import (
    TokenLayout,
    llmc_header,
    open_token_file,
    validation_sibling,
)
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes

log = logging.getLogger(__name__)


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
            f"{describe_tokenizer(tokenizer)}; its size is the default vocab_size)"
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


class Tokens(ArmKind):
    name = "tokens"
    summary = "a pre-tokenized flat binary file of unsigned integer ids, memory-mapped"
    settings = frozenset({"path", "dtype", "heldout_path"})
    needs = ("path", "path")
    encoded = False

    def load(
        self,
        spec: ArmSpec,
        cfg: DataConfig,
        base: Path,
        cache: Path,
        vocab_size: int,
        tokenizer: str,
    ) -> Arm:
        return _tokens_arm(spec, base, cache, vocab_size, cfg.heldout_fraction, tokenizer)

    def made_by(self, spec: ArmSpec, base: Path) -> Maker:
        made_by, where = _made_by(spec, base)
        return Maker(made_by, where, base / spec.tokens_path())

    def notes(self, spec: ArmSpec, cfg: DataConfig, base: Path) -> list[tuple[str, Path]]:
        """A val.bin beside the file, unused: spans of the file are held out instead."""
        if spec.heldout_path is not None or not cfg.heldout_fraction:
            return []
        sibling = validation_sibling(base / spec.tokens_path())
        if sibling is None:
            return []
        return [
            (
                f"arm {spec.name!r}: {sibling.name} lies beside {spec.tokens_path()}, and spans "
                f"of {spec.tokens_path()} are held out instead: set heldout_path = "
                f"{str(Path(spec.tokens_path()).with_name(sibling.name))!r} in the arm to "
                "evaluate on it (before the run's first checkpoint: it changes the arm's data)",
                sibling,
            )
        ]

    def size_estimate(self, spec: ArmSpec, base: Path, shared: dict[str, Any]) -> float:
        """The file's ids, exactly."""
        named = base / spec.tokens_path()
        record = read_record(named)
        recorded = record.dtype if record is not None else None
        return open_token_file(
            f"arm {spec.name!r}", named.resolve(), spec.dtype, recorded, named
        ).count

    def export_paths(self, arm: dict[str, Any]) -> list[str]:
        # Its held-out file too: a resumed run without it refuses to start.
        return [p for p in (arm.get("path"), arm.get("heldout_path")) if isinstance(p, str)]


register(Tokens())
