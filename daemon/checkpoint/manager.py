"""CheckpointManager: owns when, where and what is saved in a run directory, and what is trusted.

Public surface: `save(snapshot, trigger)` and `load(expect)`, plus `due(step)` for the cadence.

Write protocol (each step durable before the next):
  payload `.bin.<pid>.tmp` (hashed on a second thread while written) → fsync → manifest
  `.json.<pid>.tmp` → fsync → rename of the payload → fsync dir → rename of the manifest → fsync dir.
The manifest is the commit marker: a payload without one is an interrupted write, never loaded.
Everything that needs space is written before anything in place changes, so a full disk leaves an
earlier checkpoint of the same step (one rewritten after a config change) untouched.
Older checkpoints are deleted only after the new one is committed, on a background thread.

`save` writes synchronously; `save_async` hands the same work to one background writer thread
(`checkpoint.writer.BackgroundWriter`): at most one write is in flight, a new one waits for it, and the
writes commit in the order they were submitted.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manifest import (
    FORMAT_VERSION,
    MAX_MANIFEST_BYTES,
    LayoutEntry,
    Manifest,
    Trigger,
    decode_manifest,
    encode_manifest,
)
from andrea.daemon.checkpoint.writer import BackgroundWriter, read_payload_into, stage_payload
from andrea.daemon.config import CheckpointConfig, ModelConfig, config_changes, trajectory_of
from andrea.daemon.data.tokenizer import describe_identity
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded, read_json, regular_size
from andrea.daemon.rundir.durable import atomic_write_bytes, fsync_dir, stage
from andrea.daemon.runtime.operator_requests import REQUESTED_TRIGGERS
from andrea.daemon.runtime.validation_messages import first_problem

log = logging.getLogger(__name__)


class ResumeRefused(RuntimeError):
    """The run directory holds checkpoints that this run cannot resume exactly; a person must decide."""


@dataclass
class Snapshot:
    """The state to save at one optimizer-step boundary.

    `payload` is the whole `.bin` (a uint8 array: header, weights, m, v), which the trainer stages
    in a preallocated buffer (`writer.StagingBuffer`). `ready`, if given, blocks until its bytes
    have landed (asynchronous device-to-host copies). `fields` holds every manifest field except
    those the manager computes (file name, size, sha256, trigger, creation time).
    """

    step: int
    payload: np.ndarray
    fields: dict[str, Any]
    ready: Callable[[], None] | None = None

    @property
    def n_params(self) -> int:
        return (self.payload.size - checkpoint_format.HEADER.size) // (
            3 * checkpoint_format.DTYPE.itemsize
        )

    def payload_bytes(self) -> np.ndarray:
        """The complete payload as one contiguous uint8 array, once its bytes have landed."""
        if self.ready is not None:
            self.ready()
        step, n = checkpoint_format.HEADER.unpack_from(self.payload.data)
        if (step, n) != (
            self.step,
            self.n_params,
        ) or self.payload.size != checkpoint_format.payload_size(n):
            raise checkpoint_format.PayloadError(
                f"staged payload header (step={step}, n={n}) does not match step {self.step}"
            )
        return self.payload


#: Called by a background write when it has finished: (manifest, None, seconds) on success,
#: (None, error, seconds) on failure.
DoneCallback = Callable[["Manifest | None", "BaseException | None", float], None]


@dataclass
class Expectation:
    """What the model being built requires of a checkpoint to resume it exactly."""

    model: ModelConfig
    layout: list[LayoutEntry]
    data_identities: dict[str, str]
    config_hash: str
    allow_config_change: bool = False
    #: Further checks of a manifest against the run being built (each arm's cursor against the
    #: arm's size, say): a message per problem, and the checkpoint is skipped as damaged.
    check: Callable[[Manifest], list[str]] | None = None
    #: The run's trajectory settings (`RunConfig.trajectory()`), to name what changed.
    trajectory: dict[str, Any] | None = None
    #: The identity of the run's tokenizer ("bytes" or a sha256), and how a person knows it; None:
    #: not checked by itself (the encoded arms' identities include it all the same).
    tokenizer: str | None = None
    tokenizer_description: str = "bytes"


@dataclass
class Loaded:
    manifest: Manifest
    payload: checkpoint_format.Payload
    skipped: list[str] = field(default_factory=list)


class CheckpointManager:
    """Saves, verifies, discovers and retires the checkpoints of one run directory."""

    def __init__(
        self, run_dir: Path, policy: CheckpointConfig, read_buffer: np.ndarray | None = None
    ) -> None:
        """`read_buffer`: a preallocated uint8 array that `load` reads a payload into when it fits
        (the trainer's staging buffer), instead of allocating and faulting in a new one."""
        self.run_dir = run_dir
        self.policy = policy
        self.read_buffer = read_buffer
        self._triggers: dict[int, str] = {}
        self._lock = threading.Lock()  # _triggers: the writer thread commits, the main thread marks
        self._deletions: queue.Queue[int | None] = queue.Queue()
        self._deleter = threading.Thread(
            target=self._delete_loop, name="ckpt-retention", daemon=True
        )
        self._deleter.start()
        self._writer: BackgroundWriter | None = None
        self._remove_stale_temporaries()

    # ---- policy ----------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.policy.every > 0 and step % self.policy.every == 0

    # ---- save ------------------------------------------------------------------------------

    def save(
        self, snap: Snapshot, trigger: Trigger, before_commit: Callable[[], None] | None = None
    ) -> Manifest:
        """Write one checkpoint durably and return its manifest. Raises OSError on failure, in which
        case every earlier checkpoint is untouched and no partial file remains.

        `before_commit` runs after the payload is durable and before the manifest (the commit) is
        written: whatever must reach the disk no later than the checkpoint (the loss log)."""
        bin_path = self.run_dir / rundir.bin_name(snap.step)
        man_path = self.run_dir / rundir.manifest_name(snap.step)
        # Both files are staged, durable, beside whatever is in place: a full disk or a crash until
        # the renames leaves an earlier checkpoint of the same step (rewritten after a config
        # change) as it was. The renames need no space.
        bin_tmp, digest = stage_payload(bin_path, snap.payload_bytes())
        man_tmp: Path | None = None
        try:
            size = bin_tmp.stat().st_size
            if size != checkpoint_format.payload_size(
                snap.n_params
            ) or checkpoint_format.read_header(bin_tmp) != (snap.step, snap.n_params):
                raise OSError(f"{bin_path}: re-read does not match what was written")
            if before_commit is not None:
                before_commit()
            manifest = Manifest(
                step=snap.step,
                n_params=snap.n_params,
                bin_file=bin_path.name,
                bin_size=size,
                bin_sha256=digest,
                trigger=trigger,
                created_utc=datetime.now(UTC).isoformat(timespec="milliseconds"),
                **snap.fields,
            )
            data = encode_manifest(manifest)
            man_tmp = stage(man_path, lambda f: f.write(data))
            # When the bytes in place are these bytes, the old manifest stays true of them until
            # the new one replaces it, and the step is never without a checkpoint; otherwise it
            # must never describe the new payload's bytes, and goes first.
            if not self._same_payload(snap.step, digest):
                man_path.unlink(missing_ok=True)
            os.replace(bin_tmp, bin_path)
            fsync_dir(self.run_dir)  # the payload's name is durable before the commit's
            os.replace(man_tmp, man_path)
            fsync_dir(self.run_dir)
        except BaseException:
            bin_tmp.unlink(missing_ok=True)
            if man_tmp is not None:
                man_tmp.unlink(missing_ok=True)
            # A payload renamed without its manifest (a failed rename) is not a checkpoint, and
            # would hold space and look like a lost one at the next start.
            if bin_path.exists() and not man_path.exists():
                bin_path.unlink(missing_ok=True)
            raise
        with self._lock:
            self._triggers[snap.step] = trigger
            self._retire()
        return manifest

    def _same_payload(self, step: int, digest: str) -> bool:
        """Whether the checkpoint of `step` in place has a manifest that names these bytes."""
        try:
            return read_manifest(self.run_dir, step, rng_trial=False).bin_sha256 == digest
        except (OSError, ValueError):
            return False

    # ---- background writes -----------------------------------------------------------------

    def save_async(
        self,
        snap: Snapshot,
        trigger: Trigger,
        on_done: DoneCallback,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        """`save` on the writer thread. Waits first for a write in flight (never skips one); the
        snapshot's arrays must stay unchanged until `on_done` has been called. `on_done` receives
        the manifest, or the exception (OSError: the write failed and every earlier checkpoint is
        intact; anything else is re-raised by the next `wait`, after `on_done`)."""
        if self._writer is None:
            self._writer = BackgroundWriter()

        def job() -> None:
            t0 = time.perf_counter()
            try:
                manifest = self.save(snap, trigger, before_commit)
            except BaseException as e:
                on_done(None, e, time.perf_counter() - t0)
                if not isinstance(e, OSError):
                    raise
                return
            on_done(manifest, None, time.perf_counter() - t0)

        self._writer.submit(job, label=snap.step)

    def in_flight(self) -> int | None:
        """The step whose background write has not finished yet, if any."""
        w = self._writer
        if w is None or not w.busy or not isinstance(w.label, int):  # labelled with its step
            return None
        return w.label

    def wait(self) -> None:
        """Block until no background write is in flight. Re-raises a write's unexpected error
        (not an OSError: those were reported to its callback)."""
        if self._writer is not None:
            self._writer.wait()

    def mark_requested(self, step: int, trigger: Trigger) -> bool:
        """Turn an existing checkpoint into an operator-requested one (kept as an audit point).
        False when the run directory no longer holds it intact (a person pruned or damaged it):
        the caller writes it again. A manifest that cannot be rewritten (a full disk) keeps its
        old trigger, with a warning: the checkpoint itself is intact."""
        man_path = self.run_dir / rundir.manifest_name(step)
        with self._lock:
            if (manifest := self._present(step)) is None:
                return False
            try:
                atomic_write_bytes(
                    man_path, encode_manifest(manifest.model_copy(update={"trigger": trigger}))
                )
            except OSError as e:
                log.warning(
                    "checkpoint %d could not be marked %s (%s); it stays %s and may be retired",
                    step,
                    trigger,
                    e,
                    manifest.trigger,
                )
                return True
            self._triggers[step] = trigger
            return True

    def holds(self, step: int) -> bool:
        """Whether the run directory still has a checkpoint of `step` (its manifest and a payload of
        the declared size: a cheap look, not a verification)."""
        return self._present(step) is not None

    def _present(self, step: int) -> Manifest | None:
        try:
            manifest = read_manifest(self.run_dir, step, rng_trial=False)
            if regular_size(self.run_dir / manifest.bin_file) == manifest.bin_size:
                return manifest
        except (OSError, ValueError):
            pass
        return None

    # ---- retention -------------------------------------------------------------------------

    def _retire(self) -> None:
        requested = sorted(
            s
            for s, t in self._triggers.items()
            if self.policy.keep_requested and t in REQUESTED_TRIGGERS
        )
        rolling = sorted(set(self._triggers) - set(requested))
        for step in rolling[: -self.policy.keep_latest]:
            del self._triggers[step]
            self._deletions.put(step)
        # Audit points are kept, but not without bound: a signal sent in a loop must not fill the
        # disk (200 SIGUSR1s at andrea-120m would be ~266 GB). The oldest go first.
        for step in requested[: -self.policy.max_requested]:
            log.warning(
                "retiring audit checkpoint %d: more than checkpoint.max_requested = %d are kept",
                step,
                self.policy.max_requested,
            )
            del self._triggers[step]
            self._deletions.put(step)

    def _delete_loop(self) -> None:
        while (step := self._deletions.get()) is not None:
            # Manifest first: a half-deleted checkpoint must look absent, never valid.
            for name in (rundir.manifest_name(step), rundir.bin_name(step)):
                try:
                    (self.run_dir / name).unlink(missing_ok=True)
                except OSError as e:
                    log.warning("could not delete %s: %s", name, e)
            log.debug("retired checkpoint %d", step)

    def close(self) -> None:
        """Finish the write in flight and pending deletions, and stop the background threads.
        A write's unexpected error is not re-raised here (the owner's `wait` does that)."""
        if self._writer is not None:
            self._writer.close()
        self._deletions.put(None)
        self._deleter.join()

    # ---- discovery and load ----------------------------------------------------------------

    def _remove_stale_temporaries(self) -> None:
        for p in self.run_dir.glob(rundir.CHECKPOINT_TEMPORARIES):
            log.warning("removing %s: left by a write that did not finish", p.name)
            p.unlink(missing_ok=True)

    def candidates(self) -> list[int]:
        return checkpoint_steps(self.run_dir)

    def orphans(self) -> list[str]:
        """Payloads without a manifest: writes interrupted between the two renames."""
        have = set(self.candidates())
        return sorted(
            p.name
            for p in self.run_dir.iterdir()
            if (parsed := rundir.parse_checkpoint_name(p.name))
            and parsed[1] == "bin"
            and parsed[0] not in have
        )

    def verify(
        self, step: int, out: np.ndarray | None = None
    ) -> tuple[Manifest, checkpoint_format.Payload]:
        return verify_checkpoint(self.run_dir, step, out)

    def load(self, expect: Expectation, step: int = -1) -> Loaded | None:
        """The newest intact checkpoint (or exactly `step`), checked against `expect`.

        Damaged checkpoints are reported and skipped. An intact one that this run cannot resume
        exactly (other model, changed data or config) raises ResumeRefused: falling back to an
        older checkpoint or a fresh start would silently change the run. None when the directory
        has no checkpoint at all.
        """
        steps = self._steps_to_search(step)
        try:
            loaded = newest_intact(
                self.run_dir,
                steps,
                self.read_buffer,
                on_skip=_log_skip,
                check=self._resumable_check(expect, steps),
            )
        except NoIntactCheckpoint as e:
            raise ResumeRefused(
                f"none of the {len(e.skipped)} checkpoints in {self.run_dir} is intact:\n  "
                + "\n  ".join(e.skipped)
                + "\nRefusing to start from scratch over them; move them away to start a new run."
            ) from None
        if loaded is not None:
            # Checkpoints above the resume point were skipped as damaged; they will be rewritten
            # when training reaches their step again and must not count towards retention.
            s = loaded.manifest.step
            self._triggers = {c: self._read_trigger(c) for c in self.candidates() if c <= s}
        return loaded

    def _steps_to_search(self, step: int) -> list[int]:
        """The steps `load` looks at, newest first: every committed one, or exactly `step`."""
        orphans = self.orphans()
        for name in orphans:
            log.warning("ignoring %s: it has no manifest (a write was interrupted)", name)
        steps = self.candidates()
        if not steps and len(orphans) > 1:
            # One payload without a manifest is the first checkpoint's interrupted write; several
            # prove that a run with committed checkpoints was here and its manifests are gone.
            # Starting from step 0 would overwrite them.
            raise ResumeRefused(
                f"{self.run_dir} holds checkpoint payloads ({', '.join(orphans)}) but no manifest:"
                " a run existed here and its manifests were deleted or lost. Refusing to start"
                " over them; restore the manifests, or move the payloads away to start a new run."
            )
        if step != -1:
            if step not in steps:
                raise ResumeRefused(f"no checkpoint for step {step} in {self.run_dir}")
            steps = [step]
        return steps

    def _resumable_check(self, expect: Expectation, steps: list[int]) -> Callable[[Manifest], None]:
        """The check `newest_intact` runs on each verified manifest. Damage skips the checkpoint
        (ValueError); a sound one this run cannot resume exactly stops the search (ResumeRefused):
        an older one would silently change the run."""
        expected_n = sum(int(np.prod(e.shape, dtype=np.int64)) for e in expect.layout)

        def resumable(manifest: Manifest) -> None:
            s = manifest.step
            if manifest.format_version < FORMAT_VERSION:
                # A run upgraded to format 2 never writes format 1 again: one after a format 2
                # checkpoint had its hash stripped.
                if any(c < s and _is_current(self.run_dir, c) for c in steps):
                    raise ValueError(
                        "format 1 manifest (no content hash) after a format 2 checkpoint:"
                        " its content hash was removed"
                    )
                log.warning(
                    "%s has no content hash (format 1, written by an older version)",
                    rundir.manifest_name(s),
                )
            problems = resume_problems(manifest, expect)
            if problems:
                raise ResumeRefused(
                    f"checkpoint {rundir.bin_name(s)} cannot resume this run exactly:\n  "
                    + "\n  ".join(problems)
                    + "\nStart with the configuration it was written with, or use a new run"
                    " directory."
                )
            if manifest.n_params != expected_n:
                raise ValueError(f"n_params {manifest.n_params}, the model has {expected_n}")
            damage = expect.check(manifest) if expect.check is not None else []
            if damage:
                raise ValueError("; ".join(damage))

        return resumable

    def _read_trigger(self, step: int) -> str:
        try:
            path = self.run_dir / rundir.manifest_name(step)
            return read_json(path, MAX_MANIFEST_BYTES)["trigger"]
        except (OSError, ValueError, KeyError, TypeError):
            return "cadence"


class NoIntactCheckpoint(ValueError):
    """Every checkpoint looked at is damaged; `skipped` says why, one line each."""

    def __init__(self, skipped: list[str]) -> None:
        super().__init__("no intact checkpoint: " + "; ".join(skipped))
        self.skipped = skipped


def _log_skip(step: int, reason: str) -> None:
    log.warning("skipping checkpoint %d: %s", step, reason)


def newest_intact(
    run_dir: Path,
    steps: Sequence[int],
    out: np.ndarray | None = None,
    on_skip: Callable[[int, str], None] | None = None,
    check: Callable[[Manifest], None] | None = None,
) -> Loaded | None:
    """The first intact checkpoint of `steps` (newest first, as `checkpoint_steps` lists them),
    with the damaged ones before it in `skipped`. None when `steps` is empty; NoIntactCheckpoint
    when none of them is intact. `check(manifest)` runs on each verified manifest before its
    payload is read: a ValueError skips that checkpoint as damaged, any other exception ends the
    search. `on_skip(step, reason)` hears of each skipped one. Read-only, like `verify_checkpoint`."""
    skipped: list[str] = []
    for step in steps:
        try:
            manifest = read_manifest(run_dir, step)
            if check is not None:
                check(manifest)
            payload = verify_payload(run_dir, manifest, out)
        except (ValueError, OSError) as e:
            skipped.append(f"{rundir.manifest_name(step)}: {e}")
            if on_skip is not None:
                on_skip(step, str(e))
            continue
        return Loaded(manifest, payload, skipped)
    if skipped:
        raise NoIntactCheckpoint(skipped)
    return None


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps that have a manifest, newest first. Read-only: safe beside a running trainer."""
    steps = []
    for p in run_dir.iterdir():
        parsed = rundir.parse_checkpoint_name(p.name)
        if parsed and parsed[1] == "json":
            steps.append(parsed[0])
    return sorted(steps, reverse=True)


def read_manifest(run_dir: Path, step: int, *, rng_trial: bool = True) -> Manifest:
    """The verified manifest of `step` (bounded read, content hash, field checks); ValueError
    naming the problem when it is not intact, OSError when it cannot be read. `rng_trial=False`:
    the RNG states are checked without torch, for a reader that never restores them."""
    man_path = run_dir / rundir.manifest_name(step)
    try:
        manifest = decode_manifest(read_bounded(man_path, MAX_MANIFEST_BYTES), rng_trial=rng_trial)
    except FileRejected:
        raise
    except (ValidationError, ValueError) as e:
        raise ValueError(f"manifest unreadable: {_first_line(e)}") from None
    if manifest.step != step:
        raise ValueError(f"manifest says step {manifest.step}, file name says {step}")
    return manifest


def verify_payload(
    run_dir: Path, manifest: Manifest, out: np.ndarray | None
) -> checkpoint_format.Payload:
    """The payload is read once, hashed on a second thread as it arrives, into `out` (a uint8
    array, reused when large enough) or a new buffer; the returned arrays are views of it.
    Nothing is allocated before the file's size is known to be the one the manifest declares."""
    bin_path = run_dir / rundir.bin_name(manifest.step)
    if not bin_path.exists():
        raise ValueError("payload missing")
    size = regular_size(bin_path)
    if size != manifest.bin_size or size != checkpoint_format.payload_size(manifest.n_params):
        raise ValueError(f"payload is {size} bytes, manifest says {manifest.bin_size}")
    buf, digest = read_payload_into(bin_path, size, out)
    if digest != manifest.bin_sha256:
        raise ValueError(
            f"payload sha256 {digest[:12]}… does not match manifest {manifest.bin_sha256[:12]}…"
        )
    step_h, n_h = checkpoint_format.HEADER.unpack_from(buf.data)
    if (step_h, n_h) != (manifest.step, manifest.n_params):
        raise ValueError(f"payload header (step={step_h}, n={n_h}) disagrees with manifest")
    n = manifest.n_params
    flat = buf[checkpoint_format.HEADER.size :].view(checkpoint_format.DTYPE)
    return checkpoint_format.Payload(step_h, n, flat[:n], flat[n : 2 * n], flat[2 * n :])


def _verify(
    run_dir: Path, step: int, out: np.ndarray | None
) -> tuple[Manifest, checkpoint_format.Payload]:
    manifest = read_manifest(run_dir, step)
    return manifest, verify_payload(run_dir, manifest, out)


def _is_current(run_dir: Path, step: int) -> bool:
    """Whether the manifest of `step` claims the current format (a cheap look, not a verification)."""
    try:
        raw = read_bounded(run_dir / rundir.manifest_name(step), MAX_MANIFEST_BYTES)
        return json.loads(raw).get("format_version") == FORMAT_VERSION
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def verify_checkpoint(
    run_dir: Path, step: int, out: np.ndarray | None = None
) -> tuple[Manifest, checkpoint_format.Payload]:
    """Parse the manifest of `step` and check its payload's size, header and sha256; ValueError
    with the reason when the checkpoint is not intact (a file that cannot be read included).
    Read-only, so safe beside a running trainer (unlike building a CheckpointManager, which
    removes stale temporary files)."""
    try:
        return _verify(run_dir, step, out)
    except OSError as e:
        raise ValueError(f"{e.filename or run_dir}: {e.strerror or e}") from None


def _first_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return first_problem(e)
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def resume_problems(m: Manifest, expect: Expectation) -> list[str]:
    """Why a sound checkpoint cannot resume the run `expect` describes (empty: it can). Another
    world size is not among them: the trainer resumes it, announced as not bit-exact."""
    out = []
    # A compute-only setting (activation recompute) may change at any restart.
    same_model = m.model.arithmetic() == expect.model.arithmetic()
    if not same_model:
        diff = {
            k: (getattr(m.model, k), getattr(expect.model, k))
            for k in ModelConfig.model_fields
            if k not in ModelConfig.COMPUTE_ONLY and getattr(m.model, k) != getattr(expect.model, k)
        }
        out.append(
            "model config differs (checkpoint → this run): "
            + ", ".join(f"{k}: {a} → {b}" for k, (a, b) in diff.items())
        )
    elif m.layout != expect.layout:
        out.append("parameter layout differs (same config, different code?)")
    if expect.tokenizer not in (None, m.tokenizer) and not expect.allow_config_change:
        out.append(
            f"tokenizer differs: the checkpoint's data was encoded with {describe_identity(m.tokenizer)}, "
            f"this run's [data] tokenizer is {expect.tokenizer_description}"
        )
    saved = {c.name: c.identity for c in m.data}
    if saved != expect.data_identities and not expect.allow_config_change:
        for name in sorted(set(saved) | set(expect.data_identities)):
            a, b = saved.get(name), expect.data_identities.get(name)
            if a != b:
                out.append(f"data arm {name!r}: {_short(a)} → {_short(b)}")
        out.append(
            "pass --allow-config-change to continue with the changed arms on purpose (a removed "
            "arm's cursor is dropped, an added or changed arm starts from its beginning)"
        )
    if m.config_hash != expect.config_hash and not expect.allow_config_change:
        changes = (
            config_changes(trajectory_of(m.config), expect.trajectory)
            if expect.trajectory is not None
            else []
        )
        if not same_model:
            # No flag resumes another model (its line above): the hint is for the rest alone.
            changes = [c for c in changes if not c.startswith("model.")]
        if changes or same_model:
            out.append(
                "training config differs from the checkpoint's: "
                + ("; ".join(changes) if changes else "(optimizer, batch, seed, data or mixing)")
                + "; pass --allow-config-change to continue under the new one on purpose"
            )
    return out


def _short(identity: str | None) -> str:
    return "absent" if identity is None else identity[:12]


def layout_of(named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> list[LayoutEntry]:
    out, offset = [], 0
    for name, shape in named_shapes:
        out.append(LayoutEntry(name=name, shape=list(shape), offset=offset))
        offset += int(np.prod(shape, dtype=np.int64))
    return out
