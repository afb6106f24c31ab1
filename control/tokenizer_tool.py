"""``andreactl tokenizer``: a subword tokenizer without the internet, and token files from text.

- ``train``: a byte-level BPE (Hugging Face `tokenizers`) trained on the **training** documents of a
  run's text arms (stdlib, text, jsonl, parquet), never on its held-out ones: the split is the one the run
  uses (daemon/data/heldout.py), decided before the tokenizer exists. It writes the run's
  ``tokenizer.json`` and measures the compression (bytes per token) of each arm.
- ``encode``: text files, JSON Lines and Parquet files into one flat tokens file, documents joined as in an arm,
  with ``FILE.json`` beside it saying which tokenizer made it (daemon/data/encoding.py): the role of
  nanoGPT's ``prepare.py``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from andrea.control import reports
from andrea.control.commands.conventions import UserError
from andrea.control.commands.formatting import human_bytes
from andrea.daemon.checkpoint.manager import checkpoint_steps
from andrea.daemon.config import (
    DEFAULT_MAX_DOCUMENT_BYTES,
    ArmSpec,
    ConfigError,
    DataConfig,
    RunConfig,
    build_config,
    load_toml,
)
from andrea.daemon.data.arms import arm_documents, cache_root, load_arms
from andrea.daemon.data.compression import measure, sampled
from andrea.daemon.data.encoding import Document, record_path, write_tokens_file
from andrea.daemon.data.heldout import is_held_out
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.data.open_settings import resolve_heldout_fraction
from andrea.daemon.data.parquet import parquet_documents
from andrea.daemon.data.sources import (
    DEFAULT_FIELD,
    DataError,
    SourceRejected,
    check_link,
    jsonl_documents,
    link_roots,
    read_file,
)
from andrea.daemon.data.tokenizer import (
    BYTES,
    END_OF_DOCUMENT,
    FileTokenizer,
    RunTokenizer,
    padded_vocab,
)
from andrea.daemon.rundir.boundedio import irregular
from andrea.daemon.rundir.durable import atomic_write_bytes
from andrea.daemon.rundir.layout import CONFIG_FILE

if TYPE_CHECKING:  # imported where a tokenizer is trained: the other commands need none of it
    from tokenizers import Tokenizer
    from tokenizers.trainers import BpeTrainer

#: The byte-level alphabet: a BPE vocabulary starts with these 256 ids.
ALPHABET = 256
#: The largest vocabulary `train` makes (uint32 token files hold any, the embedding is the limit).
MAX_VOCAB = 1 << 20
#: Bytes of each arm's training documents that its compression is measured on.
COMPRESSION_SAMPLE = 4 << 20


@dataclass
class _Tally:
    """One arm's documents as training went through them."""

    arm: str
    documents: int = 0
    held_out: int = 0
    bytes: int = 0
    sample: list[str] = field(default_factory=list)
    sample_bytes: int = 0

    def add(self, text: str, size: int) -> None:
        self.documents += 1
        self.bytes += size
        if self.sample_bytes < COMPRESSION_SAMPLE:
            self.sample.append(text)
            self.sample_bytes += size


def run_config(run_dir: Path) -> RunConfig:
    """The config of the run in `run_dir`, as its run.toml says (UserError without one)."""
    path = run_dir / CONFIG_FILE
    try:
        kind = irregular(path, follow_symlinks=True)
    except FileNotFoundError:
        raise UserError(
            f"{path} does not exist: write the run's run.toml (its [[data.arms]]) first, or start "
            "the run once"
        ) from None
    if kind is not None:
        raise UserError(f"{path}: not a regular file ({kind}); the run's run.toml must be one")
    try:
        return build_config(load_toml(path), source=str(path))
    except ConfigError as e:
        raise UserError(str(e)) from None


def _text(doc_id: str, doc: str | bytes) -> str:
    if isinstance(doc, str):
        return doc
    try:
        return doc.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"document {doc_id}: not UTF-8 text (byte {e.start:,}); a subword tokenizer encodes "
            "text: convert it, or leave it out of the arm"
        ) from None


def _training_texts(
    specs: list[ArmSpec], run_dir: Path, data: DataConfig, tallies: dict[str, _Tally]
) -> Iterator[str]:
    """The training documents of `specs`, in order, as text; held-out ones are counted, never
    yielded."""
    shared: dict[str, Any] = {}  # the standard library's documents, extracted once
    for spec in specs:
        tally = tallies[spec.name]
        fraction = data.heldout_fraction
        try:
            docs = arm_documents(spec, run_dir, bound=data.document_bound, shared=shared)
        except SourceRejected as e:
            raise UserError(f"arm {spec.name!r}: {e}") from None
        for doc_id, doc in docs:
            if fraction and is_held_out(doc_id, fraction):
                tally.held_out += 1
                continue
            text = _text(doc_id, doc)
            tally.add(text, len(doc) if isinstance(doc, bytes) else len(text.encode()))
            yield text


def _select_arms(cfg: RunConfig, names: list[str] | None) -> list[ArmSpec]:
    text_arms = [s for s in cfg.data.arms if s.encoded]
    if names:
        known = {s.name: s for s in cfg.data.arms}
        for name in names:
            if name not in known:
                raise UserError(
                    f"--arm {name}: the run has no such arm (its arms: {', '.join(known)})"
                )
            if not known[name].encoded:
                raise UserError(
                    f"--arm {name}: a {known[name].kind} arm holds ids, not text to train on"
                )
        text_arms = [s for s in text_arms if s.name in names]
    if not text_arms:
        text_kinds = [k for k in kinds.names() if kinds.kind(k).encoded]
        raise UserError(
            f"the run has no text arm ({', '.join(text_kinds)}) to train a tokenizer on"
        )
    return text_arms


def _new_bpe(vocab_size: int, progress: bool) -> tuple[Tokenizer, BpeTrainer]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
        # Id 0: the end of a document, which joins the arms' documents (tokenizer.py).
        special_tokens=[END_OF_DOCUMENT],
    )
    return tokenizer, trainer


def default_out(run_dir: Path, cfg: RunConfig) -> Path:
    """Where `train` writes: the run's [data] tokenizer, or tokenizer.json in the run directory."""
    return run_dir / ("tokenizer.json" if cfg.data.tokenizer == BYTES else cfg.data.tokenizer)


def train(
    run_dir: Path,
    vocab_size: int,
    arms: list[str] | None,
    out: Path | None,
    progress: bool,
    cache_dir: Path | None = None,
    warm: bool = True,
) -> reports.TokenizerTrainReport:
    """Train a byte-level BPE of `vocab_size` ids on the training documents of the run's text
    arms (or of `arms`), write it to `out` (default: `default_out`), and measure it. With `warm`,
    encode those arms with it into the token cache (`cache_dir`, default the run's), as the run's
    first start would: that start then reads no document again."""
    if not ALPHABET < vocab_size <= MAX_VOCAB:
        raise UserError(
            f"--vocab-size {vocab_size}: a byte-level BPE needs {ALPHABET + 1}..{MAX_VOCAB:,}"
        )
    started = time.monotonic()
    cfg, _ = resolve_heldout_fraction(run_config(run_dir), bool(checkpoint_steps(run_dir)), run_dir)
    specs = _select_arms(cfg, arms)
    out = out if out is not None else default_out(run_dir, cfg)
    if out.exists():
        raise UserError(f"{out} exists: remove it first (a run that uses it resumes only under it)")
    try:  # a [data] tokenizer in a folder of its own ("tok/notes.json"): made, before the work
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create {out.parent} for {out}: {e.strerror or e}") from None
    fraction = cfg.data.heldout_fraction
    tallies = {s.name: _Tally(s.name) for s in specs}
    bpe, trainer = _new_bpe(vocab_size, progress)
    try:
        bpe.train_from_iterator(_training_texts(specs, run_dir, cfg.data, tallies), trainer)
    except DataError as e:
        raise UserError(str(e)) from None
    raw = bpe.to_str().encode()
    atomic_write_bytes(out, raw)
    made = FileTokenizer(str(out), out, raw)
    warmed = _warm_cache(cfg, specs, run_dir, made, cache_dir) if warm else None
    return reports.TokenizerTrainReport(
        time=reports.utc_now(),
        run_dir=str(run_dir),
        out=str(out),
        sha256=made.identity,
        n_vocab=made.n_vocab,
        model_vocab_size=padded_vocab(made.n_vocab),
        heldout_fraction=fraction,
        arms=[_arm_row(t, made) for t in tallies.values()],
        seconds=round(time.monotonic() - started, 3),
        cache_dir=str(warmed[0]) if warmed else None,
        cache_seconds=round(warmed[1], 3) if warmed else None,
    )


def _warm_cache(
    cfg: RunConfig, specs: list[ArmSpec], run_dir: Path, made: RunTokenizer, cache: Path | None
) -> tuple[Path, float]:
    """Encode the arms `specs` with the new tokenizer into the token cache the run's first start
    reads (their entries do not depend on where the tokenizer file lies, only on its bytes)."""
    started = time.monotonic()
    data = cfg.data.model_copy(
        # A --cache-dir is the working directory's; the run's [data] cache_dir is the run's.
        update={
            "arms": specs,
            "cache_dir": str(cache.expanduser().absolute()) if cache else cfg.data.cache_dir,
        }
    )
    try:
        load_arms(data, run_dir, padded_vocab(made.n_vocab), tokenizer=made)
    except DataError as e:
        raise UserError(str(e)) from None
    except OSError as e:
        raise UserError(f"the token cache could not be warmed: {e}") from None
    return cache_root(data, run_dir), time.monotonic() - started


def _arm_row(tally: _Tally, tokenizer: RunTokenizer) -> reports.TokenizerArm:
    sample = measure(tokenizer, tally.sample)
    bpt = sample.bytes_per_token
    return reports.TokenizerArm(
        arm=tally.arm,
        documents=tally.documents,
        held_out=tally.held_out,
        bytes=tally.bytes,
        bytes_per_token=round(bpt, 4) if bpt is not None else None,
        warning=sample.warning(),
    )


def train_text(report: reports.TokenizerTrainReport, run_dir: Path, cfg_tokenizer: str) -> str:
    """`train`'s report for a person."""
    held = (
        f"{report.heldout_fraction:.0%} of each arm held out, never seen"
        if report.heldout_fraction
        else "nothing held out"
    )
    lines = [
        f"{report.out}: byte-level BPE of {report.n_vocab:,} ids (model vocab_size "
        f"{report.model_vocab_size:,}), sha256 {report.sha256[:16]}…, trained in "
        f"{report.seconds:.1f} s on the arms' training documents ({held})",
        f"  {'arm':<16} {'documents':>10} {'held out':>9} {'size':>10} {'bytes/token':>12}",
    ]
    for a in report.arms:
        bpt = f"{a.bytes_per_token:.2f}" if a.bytes_per_token is not None else "-"
        lines.append(
            f"  {a.arm:<16} {a.documents:>10,} {a.held_out:>9,} {human_bytes(a.bytes):>10} {bpt:>12}"
        )
    lines += [f"warning: arm {a.arm}: {a.warning}" for a in report.arms if a.warning]
    if report.cache_dir is not None:
        lines.append(
            f"the arms are encoded with it into the token cache {report.cache_dir} "
            f"({report.cache_seconds:.1f} s): the run's first start reads no document again"
        )
    # run.toml's paths are relative to the run directory, --out's to the shell's directory.
    out, home = Path(report.out).absolute(), run_dir.absolute()
    relative = out.relative_to(home) if out.is_relative_to(home) else out
    if cfg_tokenizer == BYTES:
        lines.append(
            f'to train with it: [data] tokenizer = "{relative}" in {run_dir / CONFIG_FILE} '
            "(before the run's first start: a tokenizer is part of its data)"
        )
    return "\n".join(lines)


class ProgressBar:
    """An encode's progress on a terminal: percent, bytes, rate and time left, redrawn at most
    five times a second; nothing when `stream` is not a terminal (a log, a pipe)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.started = self.drawn = time.monotonic()

    def update(self, done: int, documents: int = 0) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.drawn < 0.2:
            return
        self.drawn = now
        rate = done / max(now - self.started, 1e-9)
        # The documents' text is a little smaller than the files (JSON's quoting, gzip): the bar
        # stays below 100% until the end.
        frac = min(done / self.total, 0.99)
        eta = (self.total - done) / rate if rate > 0 and done < self.total else 0
        bar = "#" * int(30 * frac)
        self.stream.write(
            f"\r  encoding {frac:4.0%} [{bar:<30}] {human_bytes(done)} of ~{human_bytes(self.total)}"
            f", {human_bytes(rate)}/s, {eta:4.0f} s left "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def input_files(patterns: list[str], follow_links: bool = False) -> list[Path]:
    """The inputs, in the order given (each glob's matches sorted), once each. A glob's match that
    leads out of the glob's directory through a link is refused unless `follow_links` (a file
    named in full is the person's to name)."""
    out: list[Path] = []
    for pattern in patterns:
        globbed = any(c in pattern for c in "*?[")
        matches = sorted(glob(pattern, recursive=True)) if globbed else [pattern]
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not globbed and not files:
            _named_input(Path(pattern))
        if not files:
            raise UserError(f"{pattern}: no such file")
        roots = None if follow_links or not globbed else link_roots([pattern], Path.cwd())
        for f in files:
            try:
                check_link(f, roots, advice="pass --follow-links to read files kept behind links")
            except SourceRejected as e:
                raise UserError(f"--input {pattern}: {e}") from None
        out.extend(f for f in files if f not in out)
    return out


def _named_input(path: Path) -> None:
    """UserError saying what an input named in full is, when it is no file to read: nothing, or
    a FIFO, a device, a directory (looked at, never opened: a FIFO would block)."""
    try:
        kind = irregular(path, follow_symlinks=True)
    except FileNotFoundError:
        raise UserError(f"--input {path}: no such file") from None
    except OSError as e:
        raise UserError(f"--input {path}: {e.strerror or e}") from None
    raise UserError(f"--input {path}: not a regular file ({kind}); name text or JSON Lines files")


def _documents(files: list[Path], field: str, bound: int) -> Iterator[Document]:
    for f in files:
        if f.name.endswith((".jsonl", ".jsonl.gz", ".jsonl.zst")):
            yield from jsonl_documents([f], f.parent, field, bound=bound)
        elif f.name.endswith(".parquet"):
            yield from parquet_documents([f], f.parent, field, bound=bound)
        else:
            yield f.name, read_file(f)


def encode(
    files: list[Path],
    out: Path,
    tokenizer: RunTokenizer,
    field: str = DEFAULT_FIELD,
    bound: int = DEFAULT_MAX_DOCUMENT_BYTES,
) -> reports.TokenizerEncodeReport:
    """Encode `files` (`input_files`) into the tokens file `out` and its record (`FILE.json`);
    a JSON Lines line longer than `bound` bytes is refused naming the file and line."""
    for path in (out, record_path(out)):
        if path.exists():
            raise UserError(f"{path} exists: remove it first, or choose another --out")
    total = sum(f.stat().st_size for f in files)
    bar = ProgressBar(total)
    started = time.monotonic()
    try:
        docs, sample = sampled(_documents(files, field, bound), tokenizer)
        record = write_tokens_file(
            out, docs, tokenizer, [str(f) for f in files], progress=bar.update
        )
    except (DataError, ConfigError) as e:  # ConfigError: a tokenizer that cannot encode the text
        raise UserError(str(e)) from None
    finally:
        bar.close()
    seconds = time.monotonic() - started
    return reports.TokenizerEncodeReport(
        time=reports.utc_now(),
        out=str(out),
        record=str(record_path(out)),
        tokenizer=record.tokenizer,
        tokenizer_file=record.tokenizer_file,
        n_vocab=record.n_vocab,
        dtype=record.dtype,
        inputs=len(files),
        input_bytes=total,
        documents=record.documents,
        tokens=record.tokens,
        seconds=round(seconds, 3),
        tokens_per_second=round(record.tokens / max(seconds, 1e-9), 1),
        warning=sample.warning() if sample is not None else None,
    )


def encode_text(report: reports.TokenizerEncodeReport, arm_name: str, run_dir: Path | None) -> str:
    """`encode`'s report for a person, with the arm that trains on the file (its path relative
    to `run_dir` when it lies inside)."""
    path = Path(report.out).resolve()
    if run_dir is not None and path.is_relative_to(run_dir.resolve()):
        path = path.relative_to(run_dir.resolve())
    made_by = (
        "the byte-level tokenizer"
        if report.tokenizer == BYTES
        else f"{report.tokenizer_file} (sha256 {report.tokenizer[:16]}…)"
    )
    return "\n".join(
        [
            f"{report.out}: {report.tokens:,} tokens ({report.dtype}) from {report.documents:,} "
            f"documents of {report.inputs} file(s), {human_bytes(report.input_bytes)}, in "
            f"{report.seconds:.1f} s ({report.tokens_per_second:,.0f} tokens/s)",
            f"{report.record}: made by {made_by}",
            "the arm that trains on it (in run.toml):",
            "  [[data.arms]]",
            f'  name = "{arm_name}"',
            '  kind = "tokens"',
            f'  path = "{path}"',
            f'  dtype = "{report.dtype}"',
            *([f"warning: {report.warning}"] if report.warning else []),
        ]
    )
