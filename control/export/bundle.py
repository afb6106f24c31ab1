"""Export a verified checkpoint: a folder that restores the model without the run directory.

    python -m andrea.control.export --run-dir RUN --to DEST [--step N]      (or: andreactl export)

The newest intact checkpoint of RUN (or exactly step N) is verified against its manifest, then copied
into DEST with its manifest, the run's ``run.toml``, ``metrics.json`` (loss at that step, a loss EMA,
data identifiers) and a ``README.md`` with the load procedure. ``audit/`` holds what a claim about the
run is traced to: the whole ``.loss.json``, the policy in force, ``.state.json``, ``.samples.json``,
every pivot archive, and ``plot.png`` (the audit plot up to the exported step). With ``--safetensors``
the weights are also written as ``model.safetensors`` (named tensors, the manifest's layout), which the
common model tools load, checked equal to the payload's bit for bit. The export is then proved, not assumed:
every file is fsynced and re-read at the destination (size and sha256), the checkpoint there is verified
again, and a fresh process rebuilds the model from DEST alone and evaluates one fixed batch, whose loss
must equal, bit for bit, the loss computed at export time from the source. ``export.json`` is written
last, only when all of that holds: an export without it is not verified.

Only regular files that lie inside RUN are read (:mod:`andrea.control.export.sources`): a link, a
FIFO or a device among the files an export reads refuses it, each one named.

Exit codes: 0 exported and verified; 1 written but the verification failed (DEST is left for
inspection, without export.json); 2 refused, nothing written (DEST not empty or not creatable, no
intact checkpoint, a file of RUN that is not a regular file inside it, a name that is not UTF-8,
an ``[export]`` table of run.toml that is not valid, bad arguments).

``--format hf`` adds ``DEST/hf`` (:mod:`andrea.control.export.hf`): the Hugging Face files and
their model card, nothing else, the folder to push to the Hub; the rest stays beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path, PurePath
from string import Template
from typing import BinaryIO, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.control.export import card as export_card
from andrea.control.export import hf as export_hf
from andrea.control.export.resume import resume_recipe
from andrea.control.export.sources import audit_sources, offenders
from andrea.control.export.tokenizer import (
    TOKENIZER_NAME,
    ExportTokenizer,
    TokenizerProblem,
    load_export_tokenizer,
    readme_fields,
    round_trip_text,
    run_tokenizer,
    unknown_makers,
    unknown_note,
)
from andrea.control.export.tokenizer import record as tokenizer_record
from andrea.control.reports import ErrorReport, utc_now
from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manager import (
    Loaded,
    NoIntactCheckpoint,
    checkpoint_steps,
    newest_intact,
    verify_checkpoint,
)
from andrea.daemon.checkpoint.manifest import (
    MAX_MANIFEST_BYTES,
    Environment,
    Manifest,
    MixingState,
    code_version,
)
from andrea.daemon.checkpoint.state import load_weights
from andrea.daemon.config import ModelConfig
from andrea.daemon.data.arms import CursorState
from andrea.daemon.data.tokenizer import BYTES, RunTokenizer
from andrea.daemon.model import GPT
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.boundedio import FileRejected, open_inside, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes, fsync_dir
from andrea.daemon.rundir.evallog import EvalEntry, canonical_evals, read_evals
from andrea.daemon.rundir.layout import CONFIG_FILE, EVAL_FILE, LOSS_FILE
from andrea.daemon.rundir.losslog import LossLogError, read_curve
from andrea.protocol.lineage import Lineage

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2

REPORT_NAME = "export.json"
AUDIT_DIR = "audit"
PLOT_NAME = "plot.png"
SAFETENSORS_NAME = "model.safetensors"
METRICS_NAME = "metrics.json"
README_NAME = "README.md"
#: The README of an export, a string.Template beside this module (${name} placeholders).
README_TEMPLATE = "export_readme.md.template"
#: ``--format``: andrea's folder alone, or with the Hugging Face files besides (andrea.control.export.hf).
FORMATS = ("andrea", "hf")

#: The evaluation batch: a fixed byte string, so that the check needs neither the corpus nor its cache
#: and reads the same on any machine. Rows are consecutive windows of the text repeated cyclically.
EVAL_TEXT = (
    b'"""Resume from the newest intact checkpoint, bit for bit."""\n'
    b"def resume(run_dir):\n"
    b"    manifest = json.load(open(newest(run_dir)))  # the manifest is the commit marker\n"
    b"    return restore(manifest, np.fromfile(manifest['bin_file'], dtype='<f4', offset=8))\n"
)
EVAL_ROWS = 4
#: The loss EMA of metrics.json, the same rule as the trainer's progress line but over the canonical
#: curve from step 1, so that it does not depend on where the run was stopped and resumed.
EMA_DECAY = 0.9
RELOAD_TIMEOUT_S = 300
#: The mode every file of an export is created with (export.json too: daemon/rundir/durable.py), less
#: what the umask removes: 0644 under the usual umasks (022, 002), one mode for every file.
FILE_MODE = 0o644
_COPY_CHUNK = 8 << 20


#: The README's row for the Hugging Face folder of `--format hf`.
_HF_ROW = (
    f"| `{export_hf.HF_DIR}/` | the Hugging Face folder, the one to push to the Hub: `config.json`, "
    "`generation_config.json`, `model.safetensors` (transformers' names), the tokenizer files and "
    "the model card `README.md`, nothing else; `transformers` loads it with nothing of andrea "
    "installed |\n"
)


class ExportRefused(Exception):
    """Nothing was exported: the destination is not empty, or no intact checkpoint is available."""


class ExportFailed(Exception):
    """The export was written but did not verify; the destination has no export.json."""


class _Record(BaseModel):
    # A diverged model's NaN loss is still a faithful export; keep the file strict JSON anyway.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class ExportedFile(_Record):
    name: str
    size: int
    sha256: str
    source: str | None = None


class ExportMetrics(_Record):
    """``metrics.json``: what the checkpoint is, in training terms."""

    step: int
    loss: float | None
    loss_ema: float | None
    loss_ema_rule: str = (
        f"ema_1 = loss_1; ema_s = {EMA_DECAY} * ema_(s-1) + {1 - EMA_DECAY:.1f} * loss_s"
        " (canonical curve)"
    )
    lr: float | None
    arm: str | None
    loss_history: str
    tokens_seen: int
    train_seconds: float
    data: list[CursorState]
    mixing: MixingState
    config_hash: str
    environment: Environment
    #: World sizes, and the checkpoint of another run this one started from (--init-from).
    lineage: Lineage


#: What phase 3 writes besides the checkpoint: metrics, README, the run's tokenizer file (its bytes
#: and where it was read; None for the byte-level one) and the Hugging Face model card (``hf``).
_Written = tuple[ExportMetrics, str, tuple[bytes, Path] | None, str | None]


class ReloadCheck(_Record):
    """What the fresh process found in the export folder (printed by ``--reload-check``)."""

    pid: int
    step: int
    bin_sha256: str
    n_params: int
    eval_loss: float
    eval_loss_hex: str
    tokenizer: str = Field(description='the tokenizer loaded with the model: "bytes" or its sha256')
    round_trip: bool = Field(description="it decodes its own encoding of EVAL_TEXT to EVAL_TEXT")
    seconds: float


class Evaluation(_Record):
    tokens: str
    tokens_sha256: str
    rows: int
    seq_len: int
    loss_at_export: float
    loss_at_export_hex: str
    reload: ReloadCheck
    bitwise_equal: bool


class ExportCheck(_Record):
    name: str
    detail: str


class ExportReport(_Record):
    """``export.json``: the export and everything that was verified about it."""

    format: Literal["andrea-export/1"] = "andrea-export/1"
    run_dir: str
    dest: str
    step: int
    trigger: str
    skipped: list[str]
    files: list[ExportedFile]
    tokenizer: ExportTokenizer
    metrics: ExportMetrics
    evaluation: Evaluation
    checks: list[ExportCheck]
    timings_s: dict[str, float]
    code_version: str
    torch_version: str
    created_utc: str


# --- the model and its evaluation ---------------------------------------------------------------------


@contextmanager
def _single_thread() -> Iterator[None]:
    # Bit-equality across processes holds at a fixed thread count; restore the caller's afterwards.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def eval_tokens(model: ModelConfig, tokenizer: RunTokenizer | None = None) -> np.ndarray:
    """The fixed evaluation batch, ``(EVAL_ROWS, block_size + 1)`` int64 token ids: EVAL_TEXT
    encoded with the run's tokenizer (bytes by default), repeated cyclically."""
    if tokenizer is None or tokenizer.identity == BYTES:
        ids = np.frombuffer(EVAL_TEXT, dtype=np.uint8).astype(np.int64)
    else:
        ids = np.asarray(tokenizer.encode(EVAL_TEXT.decode("utf-8")), dtype=np.int64)
    return np.resize(ids % model.vocab_size, (EVAL_ROWS, model.block_size + 1))


def build_model(manifest: Manifest, weights: np.ndarray) -> GPT:
    """A CPU GPT in eval mode (no dropout) holding ``weights`` (the payload's first flat array)."""
    # The constructor's random init is overwritten at once; it must not move the caller's generator.
    with torch.random.fork_rng(devices=[]):
        model = GPT(manifest.model)
    load_weights(list(model.named_parameters()), manifest.layout, weights)
    return model.eval()


def eval_loss(model: GPT, tokenizer: RunTokenizer | None = None) -> float:
    """Mean cross-entropy of ``model`` on the fixed evaluation batch (encoded with ``tokenizer``,
    the run's: bytes by default), one thread, no gradient."""
    tokens = torch.from_numpy(eval_tokens(model.cfg, tokenizer))
    with _single_thread(), torch.no_grad():
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
    assert loss is not None
    return loss.item()


def load_model(export_dir: Path) -> tuple[GPT, Manifest]:
    """Load an export folder (or any directory with one checkpoint) into a fresh GPT, after verifying
    the payload against its manifest. This is the procedure the export's README documents."""
    steps = checkpoint_steps(export_dir)
    if len(steps) != 1:
        raise ValueError(f"{export_dir}: expected one checkpoint manifest, found steps {steps}")
    manifest, payload = verify_checkpoint(export_dir, steps[0])
    return build_model(manifest, payload.weights), manifest


def reload_check(export_dir: Path) -> ReloadCheck:
    """Run in a fresh process by the exporter: load ``export_dir`` alone and evaluate the fixed batch."""
    started = time.monotonic()
    model, manifest = load_model(export_dir)
    tokenizer = load_export_tokenizer(export_dir, manifest)
    loss = eval_loss(model, tokenizer)
    text = round_trip_text(tokenizer, EVAL_TEXT.decode("utf-8"))
    return ReloadCheck(
        pid=os.getpid(),
        step=manifest.step,
        bin_sha256=manifest.bin_sha256,
        n_params=model.n_params(),
        eval_loss=loss,
        eval_loss_hex=loss.hex(),
        tokenizer=tokenizer.identity,
        round_trip=tokenizer.decode(tokenizer.encode(text)) == text,
        seconds=round(time.monotonic() - started, 3),
    )


# --- metrics ------------------------------------------------------------------------------------------


def _metrics(run_dir: Path, manifest: Manifest) -> ExportMetrics:
    step = manifest.step
    loss = ema = lr = None
    arm = None
    try:
        curve = read_curve(run_dir / LOSS_FILE)
    except FileNotFoundError:
        note = f"no {LOSS_FILE} in the run directory"
    except LossLogError as exc:
        note = f"{LOSS_FILE} unreadable: {exc}"
    else:
        n = int(
            np.searchsorted(curve.step, step, side="right")
        )  # the canonical entries up to `step`
        if n and curve.step[n - 1] == step:
            last = curve.entry(n - 1)
            loss, lr, arm = last.loss, last.lr, last.arm
            for value in curve.loss[:n].tolist():
                ema = value if ema is None else EMA_DECAY * ema + (1 - EMA_DECAY) * value
            gaps = step - n
            note = f"{LOSS_FILE}: {n} canonical entries up to step {step}" + (
                f" ({gaps} steps missing: the EMA skips them)" if gaps else ""
            )
        else:
            note = f"{LOSS_FILE} has no entry for step {step}"
    return ExportMetrics(
        step=step,
        loss=loss,
        loss_ema=ema,
        lr=lr,
        arm=arm,
        loss_history=note,
        tokens_seen=manifest.progress.tokens_seen,
        train_seconds=manifest.progress.train_seconds,
        data=manifest.data,
        mixing=manifest.mixing,
        config_hash=manifest.config_hash,
        environment=manifest.environment,
        lineage=manifest.lineage_or_default(),
    )


# --- files --------------------------------------------------------------------------------------------


def _copy_hashed(run_dir: Path, src: PurePath, dst: Path) -> ExportedFile:
    """Copy ``run_dir/src`` and fsync, hashing the bytes as they pass (a source that changes mid-copy
    shows in the hash). The source is opened without following a link below ``run_dir``."""
    sha = hashlib.sha256()
    size = 0
    with os.fdopen(open_inside(run_dir, src), "rb") as fin, _create(dst) as fout:
        while chunk := fin.read(_COPY_CHUNK):
            sha.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return ExportedFile(name=dst.name, size=size, sha256=sha.hexdigest(), source=str(run_dir / src))


def _create(dst: Path) -> BinaryIO:
    """A new file at ``dst``, created with `FILE_MODE` whatever the umask would give a plain
    ``open`` (0664 under a umask of 002), so that every file of an export has one mode."""
    fd = os.open(
        dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE
    )
    return os.fdopen(fd, "wb")


def _write_new(dst: Path, data: bytes, source: str | None = None) -> ExportedFile:
    with _create(dst) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return ExportedFile(
        name=dst.name, size=len(data), sha256=hashlib.sha256(data).hexdigest(), source=source
    )


def _reread(path: Path) -> tuple[int, str]:
    """Size and sha256 as read back from ``path``, its cached pages dropped first.

    After the fsync the pages are clean, so the kernel may drop them and the bytes then come from the
    storage rather than from the copy's own memory (best effort: the kernel may keep them).
    """
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while chunk := f.read(_COPY_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def _relative(f: ExportedFile, dest: Path, path: Path) -> ExportedFile:
    return f.model_copy(update={"name": str(path.relative_to(dest))})


def _write_audit(
    run_dir: Path, dest: Path, step: int, progress: Callable[[str], None]
) -> list[ExportedFile]:
    """The run's audit trail under DEST/audit: the loss log, policy and bandit files, every pivot
    archive, and the audit plot up to ``step``. Paths in the listing are relative to DEST."""
    from andrea.control.plot import DPI, audit_figure
    from andrea.control.run_events import read_run_events

    audit = dest / AUDIT_DIR
    audit.mkdir()
    files = []
    for src in audit_sources(run_dir):
        dst = audit / src
        dst.parent.mkdir(parents=True, exist_ok=True)
        files.append(_relative(_copy_hashed(run_dir, src, dst), dest, dst))
    if (audit / LOSS_FILE).is_file():
        # Drawn from the copy, so the plot shows exactly the log this export holds.
        curve = read_curve(audit / LOSS_FILE)
        if len(curve) and int(curve.step[0]) <= step:
            fig = audit_figure(
                curve,
                read_run_events(run_dir, curve),
                f"{run_dir.name}, exported at step {step}",
                until=step,
            )
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=DPI)
            plot = _write_new(audit / PLOT_NAME, png.getvalue())
            files.append(_relative(plot, dest, audit / PLOT_NAME))
    else:
        progress(f"      WARNING: {run_dir / LOSS_FILE} is missing; the export has no loss history")
    for d in [audit, *(p for p in audit.rglob("*") if p.is_dir())]:
        fsync_dir(d)
    return files


def _write_safetensors(dest: Path, manifest: Manifest, weights: np.ndarray) -> ExportedFile:
    from safetensors.numpy import save

    tensors = checkpoint_format.unflatten(
        weights, [(e.name, tuple(e.shape), e.offset) for e in manifest.layout]
    )
    # Serialized here and written as every other file is, so that it gets their mode.
    data = save(
        {name: np.ascontiguousarray(t) for name, t in tensors.items()},
        metadata={"format": "pt", "step": str(manifest.step), "bin_sha256": manifest.bin_sha256},
    )
    return _write_new(dest / SAFETENSORS_NAME, data)


def _write_hf(
    dest: Path, manifest: Manifest, weights: np.ndarray, tokenizer: bytes | None, card: str
) -> list[ExportedFile]:
    """The Hub's folder, ``DEST/hf``: the Hugging Face files (andrea.control.export.hf), the
    run's tokenizer (or, for a byte-level run, one whose ids are the bytes) and the model card,
    nothing else. Paths in the listing are relative to DEST."""
    folder = dest / export_hf.HF_DIR
    folder.mkdir()
    # A subword run's tokenizer (written in DEST already) may have an end of document to name.
    eod = None if tokenizer is None else load_export_tokenizer(dest, manifest).end_of_document
    files = export_hf.hf_files(manifest, weights, tokenizer, eod)
    files[README_NAME] = card.encode()
    written = [
        _relative(_write_new(folder / name, data), dest, folder / name)
        for name, data in files.items()
    ]
    fsync_dir(folder)
    fsync_dir(dest)
    return written


def _check_hf(dest: Path, manifest: Manifest, weights: np.ndarray) -> list[ExportCheck]:
    """The Hugging Face weights read back against the checkpoint's, bit for bit, and a byte
    run's tokenizer proved to give the byte values."""
    folder = dest / export_hf.HF_DIR
    try:
        checks = [
            ExportCheck(
                name="Hugging Face weights",
                detail=export_hf.check_weights(folder / export_hf.WEIGHTS_NAME, manifest, weights),
            )
        ]
        if manifest.tokenizer == BYTES:
            detail = export_hf.check_byte_tokenizer(
                folder / TOKENIZER_NAME, EVAL_TEXT.decode("utf-8")
            )
            checks.append(ExportCheck(name="Hugging Face byte tokenizer", detail=detail))
    except export_hf.HFExportError as exc:
        raise ExportFailed(str(exc)) from None
    return checks


def _check_safetensors(dest: Path, manifest: Manifest, weights: np.ndarray) -> str:
    """Read model.safetensors back and compare every tensor with the payload's, bit for bit."""
    from safetensors.numpy import load_file

    loaded = load_file(str(dest / SAFETENSORS_NAME))
    expected = checkpoint_format.unflatten(
        weights, [(e.name, tuple(e.shape), e.offset) for e in manifest.layout]
    )
    if loaded.keys() != expected.keys():
        raise ExportFailed(f"{SAFETENSORS_NAME} holds other tensors than the manifest's layout")
    for name, t in expected.items():
        if loaded[name].dtype != np.float32 or loaded[name].tobytes() != t.tobytes():
            raise ExportFailed(f"{SAFETENSORS_NAME}: tensor {name} differs from the payload")
    return f"{len(loaded)} tensors equal to the payload's weights, bit for bit"


def _write_export(
    run_dir: Path,
    dest: Path,
    manifest: Manifest,
    manifest_bytes: bytes,
    metrics: ExportMetrics,
    readme: str,
    progress: Callable[[str], None],
) -> list[ExportedFile]:
    """Write every file of the export durably into the existing ``dest``; what was written, with
    sizes and sha256."""
    payload = _copy_hashed(run_dir, PurePath(manifest.bin_file), dest / manifest.bin_file)
    if payload.sha256 != manifest.bin_sha256 or payload.size != manifest.bin_size:
        raise ExportFailed(
            f"{manifest.bin_file} changed while it was copied (sha256 {payload.sha256[:16]}…)"
        )
    name = rundir.manifest_name(manifest.step)
    files = [payload, _write_new(dest / name, manifest_bytes, str(run_dir / name))]
    # The config the run trains under (flags and accepted changes in), as the export's run.toml:
    # what a resume from the export needs; the person's own run.toml may leave settings open.
    if (recorded := rundir.recorded_config(run_dir)) is not None:
        files.append(_copy_hashed(run_dir, PurePath(recorded.name), dest / CONFIG_FILE))
    else:
        progress(
            f"      WARNING: {run_dir / CONFIG_FILE} is missing; the manifest's config is the only record"
        )
    files.append(_write_new(dest / METRICS_NAME, metrics.model_dump_json(indent=2).encode()))
    files.append(_write_new(dest / README_NAME, readme.encode()))
    fsync_dir(dest)
    fsync_dir(dest.parent)
    return files


def _check_text(what: str, path: Path) -> None:
    """ExportRefused for a path that is not UTF-8 text: export.json, the README and the model card
    record it as text, so such a name would fail only after every file had been copied."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise ExportRefused(
            f"{what} {shown}: the name is not UTF-8, and export.json records it as text; "
            "choose a UTF-8 name"
        ) from None


def _check_destination(dest: Path) -> None:
    _check_text("--to", dest)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise ExportRefused(f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise ExportRefused(
            f"{dest} is not empty; choose a new or empty directory (an export never overwrites)"
        )


def _check_sources(run_dir: Path) -> None:
    """Every file the export reads is a regular file inside the run directory; the offenders named."""
    _check_text("--run-dir", run_dir)
    if not run_dir.is_dir():
        raise ExportRefused(f"{run_dir}: not a run directory")
    bad = offenders(run_dir)
    if bad:
        raise ExportRefused(
            f"{run_dir} holds files an export never reads, since only regular files inside the run "
            "directory are copied (a link could point anywhere):\n  "
            + "\n  ".join(bad)
            + "\nReplace each with the file itself, or remove it, and export again."
        )


def _create_destination(dest: Path) -> None:
    """DEST, made now: a destination that cannot be made is a refusal, with nothing written."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportRefused(f"cannot create {dest}: {exc.strerror or exc}") from None


def select_checkpoint(run_dir: Path, step: int | None) -> Loaded:
    """The requested checkpoint, or the newest intact one; damaged newer ones are listed as skipped.
    ExportRefused naming what is missing or damaged (also what `andreactl generate` says)."""
    steps = checkpoint_steps(run_dir)
    if step is not None:
        if step not in steps:
            raise ExportRefused(
                f"{run_dir} has no checkpoint of step {step} (steps with a manifest: {steps})"
            )
        try:
            return Loaded(*verify_checkpoint(run_dir, step))
        except ValueError as exc:
            raise ExportRefused(
                f"checkpoint {rundir.bin_name(step)} is not intact: {exc}"
            ) from None
    try:
        loaded = newest_intact(run_dir, steps)
    except NoIntactCheckpoint as exc:
        raise ExportRefused(
            f"no intact checkpoint in {run_dir}" + "".join(f"\n  skipped {s}" for s in exc.skipped)
        ) from None
    if loaded is None:
        raise ExportRefused(f"no intact checkpoint in {run_dir}")
    return loaded


def _readme(
    report_step: int,
    manifest: Manifest,
    run_dir: Path,
    created: str,
    loss_hex: str,
    tokenizer: RunTokenizer,
    tokenizer_copied: bool,
    hf: bool = False,
) -> str:
    """The export's README.md: README_TEMPLATE filled in with this checkpoint's figures and its
    resume recipe (``tokenizer_copied``: the export holds the run's tokenizer file; ``hf``: it
    holds the Hugging Face folder too)."""
    m = manifest.model
    arms = "\n".join(
        f"| `{c.name}` | `{c.identity}` | {c.n_tokens:,} | {c.epoch}:{c.position} |"
        for c in manifest.data
    )
    template = (
        resources.files(__name__.rpartition(".")[0]).joinpath(README_TEMPLATE).read_text("utf-8")
    )
    return Template(template).substitute(
        step=report_step,
        next_step=report_step + 1,
        created=created,
        run_dir=run_dir,
        loss_hex=loss_hex,
        loss=repr(float.fromhex(loss_hex)),
        stem=rundir.checkpoint_stem(report_step),
        bin_size=f"{manifest.bin_size:,}",
        bin_sha256=manifest.bin_sha256,
        n_params=f"{manifest.n_params:,}",
        vocab_size=m.vocab_size,
        block_size=m.block_size,
        n_layer=m.n_layer,
        n_head=m.n_head,
        n_embd=m.n_embd,
        dropout=m.dropout,
        bias=m.bias,
        arms=arms,
        threads=manifest.environment.threads,
        torch_version=manifest.environment.torch_version,
        code_version=manifest.environment.code_version,
        held_out=held_out_line(manifest.step, _evals(run_dir)),
        resume=resume_recipe(
            run_dir,
            rundir.checkpoint_stem(report_step),
            TOKENIZER_NAME if tokenizer_copied else None,
        ),
        hf_row=_HF_ROW if hf else "",
        **readme_fields(tokenizer, unknown_note(unknown_makers(run_dir, manifest))),
    )


# --- the export ---------------------------------------------------------------------------------------


class _Clock:
    """Seconds spent in each phase of an export, for export.json's ``timings_s``."""

    def __init__(self) -> None:
        self.started = self.last = time.monotonic()
        self.timings: dict[str, float] = {}

    def phase(self, name: str) -> None:
        """The phase ``name`` ends now."""
        now = time.monotonic()
        self.timings[name] = round(now - self.last, 3)
        self.last = now

    def total(self) -> dict[str, float]:
        """Every phase's seconds, and the export's whole as ``total``."""
        self.timings["total"] = round(time.monotonic() - self.started, 3)
        return self.timings


def export_checkpoint(
    run_dir: Path,
    dest: Path,
    step: int | None = None,
    progress: Callable[[str], None] = print,
    safetensors: bool = False,
    hf: bool = False,
    command: str = "",
) -> ExportReport:
    """Export the newest intact checkpoint of ``run_dir`` (or exactly ``step``) into ``dest`` and prove it.

    Raises :class:`ExportRefused` before writing anything when ``dest`` is not empty or no intact
    checkpoint is available (an explicitly requested ``step`` that is damaged is refused, never replaced
    by another one), and :class:`ExportFailed` when the written export does not verify. ``progress``
    receives one line per phase. ``hf``: also the Hugging Face files and model card (export_hf).
    """
    clock = _Clock()
    _check_destination(dest)
    _check_sources(run_dir)
    progress(f"[1/5] verifying the checkpoint in {run_dir}")
    source, manifest_bytes = _verify_source(run_dir, step, progress)
    manifest, weights = source.manifest, source.payload.weights
    tokenizer, tokenizer_file = _source_tokenizer(run_dir, manifest, progress)
    clock.phase("verify_source")
    progress("[2/5] evaluating the fixed batch at export time")
    loss = eval_loss(build_model(manifest, weights), tokenizer)
    clock.phase("eval_at_export")
    progress(f"      loss {loss!r} ({loss.hex()})")
    progress(f"[3/5] copying into {dest}")
    created, metrics, written = _contents(
        run_dir, manifest, loss, (tokenizer, tokenizer_file), command if hf else None
    )
    files = _copy(run_dir, dest, source, manifest_bytes, written, (safetensors, hf), progress)
    checks = _source_checks(source)
    clock.phase("copy")
    progress(f"      {len(files)} files, {sum(f.size for f in files):,} bytes, fsynced")
    progress("[4/5] re-reading at the destination")
    checks += _destination_checks(dest, manifest, files, weights, (safetensors, hf))
    clock.phase("verify_destination")
    progress("[5/5] reloading in a fresh process")
    evaluation, reloaded = _reload_phase(dest, manifest, loss, tokenizer, clock, progress)
    report = ExportReport(
        run_dir=str(run_dir),
        dest=str(dest),
        step=manifest.step,
        trigger=manifest.trigger,
        skipped=source.skipped,
        files=files,
        tokenizer=tokenizer_record(tokenizer, tokenizer_file),
        metrics=metrics,
        evaluation=evaluation,
        checks=[*checks, reloaded],
        timings_s=clock.total(),
        code_version=code_version(),
        torch_version=torch.__version__,
        created_utc=created,
    )
    _write_report(dest, report, progress)
    return report


def _contents(
    run_dir: Path,
    manifest: Manifest,
    loss: float,
    tokenizer: tuple[RunTokenizer, tuple[bytes, Path] | None],
    card_command: str | None = None,
) -> tuple[str, ExportMetrics, _Written]:
    """When the export is made, its metrics, and what phase 3 writes besides the checkpoint:
    metrics, README, tokenizer and, with ``card_command``, the Hugging Face model card naming it.
    ExportRefused when the run's ``[export]`` table cannot be used (nothing is written yet)."""
    created = datetime.now(UTC).isoformat(timespec="milliseconds")
    metrics = _metrics(run_dir, manifest)
    readme = _readme(
        manifest.step,
        manifest,
        run_dir,
        created,
        loss.hex(),
        tokenizer[0],
        tokenizer[1] is not None,
        card_command is not None,
    )
    card = None
    if card_command is not None:
        try:
            meta = export_card.export_metadata(run_dir)
        except export_card.CardProblem as exc:
            raise ExportRefused(str(exc)) from None
        mix = export_card.mixture(run_dir, manifest.step)
        card = export_card.model_card(
            manifest, _evals(run_dir), card_command, tokenizer[0], meta, mix
        )
    return created, metrics, (metrics, readme, tokenizer[1], card)


def held_out_line(step: int, evals: Sequence[EvalEntry]) -> str:
    """The README's held-out losses at ``step``, each arm's, beside the reload-check loss."""
    held = next((e for e in reversed(evals) if e.step == step), None)
    if held is None:
        return (
            f"- **held-out loss** at step {step}: none recorded (the run evaluated no held-out "
            "split at this step; `andreactl history --eval` lists the evaluations it made)"
        )
    arms = ", ".join(f"`{n}` {a.loss:.4f}" for n, a in held.arms.items())
    return (
        f"- **held-out loss** at step {step}: {arms}; mean {held.mean_loss():.4f} (mean "
        "cross-entropy, nats per token, on each arm's fixed held-out evaluation set; "
        "`andreactl history --eval`)"
    )


def _evals(run_dir: Path) -> list:
    """The run's canonical held-out evaluations; none when it has no readable .eval.json."""
    try:
        return canonical_evals(read_evals(run_dir / EVAL_FILE))
    except (OSError, ValueError):
        return []


def _intact_detail(manifest: Manifest) -> str:
    return f"{rundir.checkpoint_stem(manifest.step)}: size, header and sha256 match its manifest"


def _source_tokenizer(
    run_dir: Path, manifest: Manifest, progress: Callable[[str], None]
) -> tuple[RunTokenizer, tuple[bytes, Path] | None]:
    """The tokenizer the checkpoint was trained with, and its file's bytes and path (None for the
    byte-level one); refused when the run's file is not that one. A tokens arm of an unknown
    tokenizer is a warning (`unknown_makers`), in the README too."""
    try:
        tokenizer, raw = run_tokenizer(run_dir, manifest)
    except TokenizerProblem as exc:
        raise ExportRefused(str(exc)) from None
    for line in unknown_makers(run_dir, manifest):
        progress(f"      WARNING: {line}; the export's README says so")
    return tokenizer, (raw, getattr(tokenizer, "path", run_dir)) if raw is not None else None


def _copy(
    run_dir: Path,
    dest: Path,
    source: Loaded,
    manifest_bytes: bytes,
    written: _Written,
    formats: tuple[bool, bool],
    progress: Callable[[str], None],
) -> list[ExportedFile]:
    """Phase 3: the checkpoint, its config, metrics, README and tokenizer (`written`), the audit
    trail and, when asked (``formats``: safetensors, hf), the safetensors weights or the Hugging
    Face folder with its model card, written durably into ``dest``."""
    manifest = source.manifest
    safetensors, hf = formats
    metrics, readme, tokenizer_file, card = written
    _create_destination(dest)
    try:
        files = _write_export(run_dir, dest, manifest, manifest_bytes, metrics, readme, progress)
        if tokenizer_file is not None:
            raw, path = tokenizer_file
            files.append(_write_new(dest / TOKENIZER_NAME, raw, str(path)))
        files += _write_audit(run_dir, dest, manifest.step, progress)
        if safetensors:
            files.append(_write_safetensors(dest, manifest, source.payload.weights))
        if hf:
            run_file = tokenizer_file[0] if tokenizer_file is not None else None
            files += _write_hf(dest, manifest, source.payload.weights, run_file, card or "")
    except (OSError, FileRejected) as exc:
        raise ExportFailed(f"writing {dest} failed: {exc}") from exc
    return files


def _source_checks(source: Loaded) -> list[ExportCheck]:
    checks = [ExportCheck(name="source checkpoint intact", detail=_intact_detail(source.manifest))]
    if source.skipped:
        checks.append(
            ExportCheck(name="newer damaged checkpoints skipped", detail="; ".join(source.skipped))
        )
    return checks


def _destination_checks(
    dest: Path,
    manifest: Manifest,
    files: list[ExportedFile],
    weights: np.ndarray,
    formats: tuple[bool, bool],
) -> list[ExportCheck]:
    """Phase 4: every file re-read, the copied checkpoint verified, and the checks as export.json
    records them; with ``formats`` (safetensors, hf) the weights written in that format are
    checked against the payload's, bit for bit."""
    _verify_destination(dest, manifest, files)
    safetensors, hf = formats
    checks = [
        ExportCheck(
            name="files re-read at the destination",
            detail=f"{len(files)} files: sizes and sha256 as written",
        ),
        ExportCheck(name="checkpoint intact at the destination", detail=_intact_detail(manifest)),
    ]
    if safetensors:
        checks.append(
            ExportCheck(
                name="safetensors weights", detail=_check_safetensors(dest, manifest, weights)
            )
        )
    return checks + (_check_hf(dest, manifest, weights) if hf else [])


def _reload_phase(
    dest: Path,
    manifest: Manifest,
    loss: float,
    tokenizer: RunTokenizer,
    clock: _Clock,
    progress: Callable[[str], None],
) -> tuple[Evaluation, ExportCheck]:
    """Phase 5: the export reloaded in a fresh process, with its tokenizer, which must compute the
    same loss."""
    reload = _reload_in_fresh_process(dest)
    clock.phase("reload")
    evaluation = _compare_reload(manifest, loss, reload, tokenizer)
    check = ExportCheck(
        name="reloaded in a fresh process",
        detail=(
            f"pid {reload.pid}: GPT and tokenizer rebuilt from {dest} alone, "
            f"eval loss {reload.eval_loss_hex} = export time, bit for bit"
        ),
    )
    progress(
        f"      pid {reload.pid}: loss {reload.eval_loss!r}, identical bits"
        f" ({reload.seconds:.2f} s in the process)"
    )
    return evaluation, check


def _write_report(dest: Path, report: ExportReport, progress: Callable[[str], None]) -> None:
    # Last, and atomically: its presence is what marks the folder as a verified export.
    atomic_write_bytes(dest / REPORT_NAME, report.model_dump_json(indent=2).encode())
    progress(
        f"exported step {report.step} to {dest} in {report.timings_s['total']:.1f} s;"
        f" report: {dest / REPORT_NAME}"
    )


def _verify_source(
    run_dir: Path, step: int | None, progress: Callable[[str], None]
) -> tuple[Loaded, bytes]:
    """Phase 1: the checkpoint to export, verified, and its manifest's bytes as they will be copied."""
    source = select_checkpoint(run_dir, step)
    for reason in source.skipped:
        progress(f"      WARNING: skipped damaged checkpoint {reason}")
    manifest = source.manifest
    name = rundir.manifest_name(manifest.step)
    manifest_bytes = read_bounded(run_dir / name, MAX_MANIFEST_BYTES)
    if Manifest.model_validate_json(manifest_bytes) != manifest:
        raise ExportRefused(f"{name} changed while it was being verified; try again")
    progress(
        f"      {rundir.checkpoint_stem(manifest.step)} intact: {manifest.bin_size:,} bytes,"
        f" sha256 {manifest.bin_sha256[:16]}…, trigger {manifest.trigger}"
    )
    return source, manifest_bytes


def _verify_destination(dest: Path, manifest: Manifest, files: list[ExportedFile]) -> None:
    """Phase 4: every file reads back as written, and the copied checkpoint verifies."""
    for f in files:
        try:
            size, digest = _reread(dest / f.name)
        except OSError as exc:
            raise ExportFailed(f"{dest / f.name}: cannot be read back: {exc}") from exc
        if (size, digest) != (f.size, f.sha256):
            raise ExportFailed(
                f"{dest / f.name}: reads back as {size} bytes, sha256 {digest[:16]}…; "
                f"wrote {f.size}, {f.sha256[:16]}…"
            )
    try:
        copied, _ = verify_checkpoint(dest, manifest.step)
    except ValueError as exc:
        raise ExportFailed(f"the copied checkpoint does not verify at {dest}: {exc}") from None
    if copied != manifest:
        raise ExportFailed(f"the manifest at {dest} differs from the source's")


def _compare_reload(
    manifest: Manifest, loss: float, reload: ReloadCheck, tokenizer: RunTokenizer
) -> Evaluation:
    """Phase 5: the fresh process must have loaded this step and its tokenizer and computed the same
    loss, bit for bit."""
    tokens = eval_tokens(manifest.model, tokenizer)
    encoding = "byte" if tokenizer.identity == BYTES else f"id of {TOKENIZER_NAME}"
    evaluation = Evaluation(
        tokens=(
            f"EVAL_TEXT of andrea.control.export.bundle, cyclic, {EVAL_ROWS} rows x {tokens.shape[1]}"
            f" tokens, token = {encoding} % vocab_size"
        ),
        tokens_sha256=hashlib.sha256(tokens.tobytes()).hexdigest(),
        rows=EVAL_ROWS,
        seq_len=tokens.shape[1] - 1,
        loss_at_export=loss,
        loss_at_export_hex=loss.hex(),
        reload=reload,
        bitwise_equal=reload.eval_loss_hex == loss.hex(),
    )
    if reload.tokenizer != manifest.tokenizer or not reload.round_trip:
        raise ExportFailed(
            f"the fresh process (pid {reload.pid}) loaded the tokenizer {reload.tokenizer} "
            f"(decodes its own encoding: {reload.round_trip}); the manifest names {manifest.tokenizer}"
        )
    if (
        not evaluation.bitwise_equal
        or reload.step != manifest.step
        or reload.bin_sha256 != manifest.bin_sha256
    ):
        raise ExportFailed(
            f"the fresh process (pid {reload.pid}) loaded step {reload.step} and computed loss "
            f"{reload.eval_loss_hex}; export time: step {manifest.step}, loss {loss.hex()}"
        )
    return evaluation


def _reload_in_fresh_process(dest: Path) -> ReloadCheck:
    argv = [sys.executable, "-B", "-m", "andrea.control.export", "--reload-check", str(dest)]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RELOAD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ExportFailed(
            f"the fresh-process reload did not finish within {RELOAD_TIMEOUT_S} s"
        ) from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise ExportFailed(
            f"the fresh-process reload exited with {done.returncode}:\n{done.stderr.strip()[-2000:]}"
        )
    try:
        return ReloadCheck.model_validate_json(lines[-1])
    except ValidationError as exc:
        raise ExportFailed(f"the fresh-process reload printed no usable result: {exc}") from None


def run_export(
    run_dir: Path,
    dest: Path,
    step: int | None,
    as_json: bool,
    safetensors: bool = False,
    export_format: str = "andrea",
) -> int:
    """Export and return the exit code; ``as_json`` prints export.json on stdout (progress on stderr)."""
    hf = export_format == "hf"
    if hf and safetensors:
        return _refused(
            "export refused: --format hf writes model.safetensors under transformers' names; "
            "leave out --safetensors",
            EXIT_REFUSED,
            as_json,
        )

    def to_stderr(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def to_stdout(line: str) -> None:
        print(line, flush=True)

    try:
        report = export_checkpoint(
            run_dir,
            dest,
            step,
            progress=to_stderr if as_json else to_stdout,
            safetensors=safetensors,
            hf=hf,
            command=_command_line(),
        )
    except ExportRefused as exc:
        return _refused(f"export refused: {exc}", EXIT_REFUSED, as_json)
    except ExportFailed as exc:
        return _refused(
            f"EXPORT NOT VERIFIED: {exc}\n{dest} has no {REPORT_NAME}; remove it before exporting again",
            EXIT_FAILED,
            as_json,
        )
    if as_json:
        print(report.model_dump_json(indent=2))
    return EXIT_OK


def _command_line() -> str:
    """The command that is running, as the person typed it (for the model card)."""
    name = Path(sys.argv[0]).stem
    program = "python -m andrea.control.export" if name == "export" else name
    return " ".join([program, shlex.join(sys.argv[1:])])


def _refused(message: str, code: int, as_json: bool) -> int:
    """Say why on stderr and, with --json, as andreactl's error document on stdout."""
    print(message, file=sys.stderr)
    if as_json:
        error = ErrorReport(time=utc_now(), command="export", exit_code=code, error=message)
        print(error.model_dump_json(indent=1))
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m andrea.control.export",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    parser.add_argument("--run-dir", type=Path, help="the run directory holding the checkpoints")
    parser.add_argument(
        "--to", type=Path, dest="dest", help="new or empty directory for the export"
    )
    parser.add_argument(
        "--step", type=int, help="export this step (default: the newest intact checkpoint)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print export.json on stdout, progress on stderr"
    )
    parser.add_argument(
        "--safetensors", action="store_true", help="also write the weights as model.safetensors"
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="andrea",
        help="hf: also DEST/hf, the folder transformers loads and the Hub takes (config.json, "
        "model.safetensors, tokenizer, model card)",
    )
    # The fresh process of the export's own verification.
    parser.add_argument("--reload-check", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reload_check is not None:
        print(reload_check(args.reload_check).model_dump_json())
        return EXIT_OK
    if args.run_dir is None or args.dest is None:
        parser.error("--run-dir and --to are required")
    return run_export(args.run_dir, args.dest, args.step, args.json, args.safetensors, args.format)


if __name__ == "__main__":
    sys.exit(main())
