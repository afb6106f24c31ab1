"""Where rank 0's records go and where each step's arm comes from: the one thing that differs
between the mixing modes, behind one interface.

- `FileSink`, fixed mode: the trainer writes `.loss.json` and `.eval.json` itself, and the fixed
  mixture assigns the arms.
- `ProxySink`, proxy mode: records go over the proxy link (the proxy owns both files and numbers
  the segments), and the arms are the proxy's assignments.
- `RecordSink` itself records nothing: the sink of the ranks other than 0 of a job (rank 0
  records the agreed values; in proxy mode rank 0's arm reaches them by the agreement).
"""

from __future__ import annotations

import logging
from pathlib import Path

from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.data.arms import FixedMixture
from andrea.daemon.rundir.evallog import EvalEntry, EvalLog
from andrea.daemon.rundir.layout import EVAL_FILE, LOSS_FILE, peer_endpoint
from andrea.daemon.rundir.losslog import LossLog, LossLogError, last_entry
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.counters import Counters
from andrea.daemon.trainer.links.proxy_client import ProxyLink
from andrea.protocol import messages
from andrea.protocol.lossentry import LossEntry

log = logging.getLogger(__name__)


class RecordSink:
    """Records nothing; its arms are the fixed mixture's, or none (`mixture` None)."""

    def __init__(self, mixture: FixedMixture | None = None) -> None:
        self.mixture = mixture
        #: A step's record that could not be written (a full disk, fixed mode): no checkpoint may
        #: hold its step until it is (`retry_unlogged`).
        self.unlogged: LossEntry | None = None

    def arm_for(self, step: int) -> int | None:
        """This rank's view of the arm of `step` (None: not known yet)."""
        return self.mixture.assign(step) if self.mixture is not None else None

    def probe_for(self, step: int) -> list[str] | None:
        """The target arms whose probe the record of `step` carries (the proxy's assignment
        says); None: no probe."""
        return None

    def record_loss(self, entry: LossEntry) -> bool:
        """Record a step; False when its record could not be written (then it is `unlogged`)."""
        return True

    def record_eval(self, entry: EvalEntry) -> None:
        """Record a held-out evaluation."""

    def record_samples(self, report: messages.SampleReport) -> None:
        """Record the samples of a step (only the proxy keeps them; the log always has them)."""

    def sync(self) -> None:
        """Make every record so far durable: the checkpoint manager calls it between payload and
        manifest, on the writer's thread for a background write. OSError when they cannot be."""

    def pending_losses(self, step: int) -> list[LossEntry]:
        """Records up to `step` not yet durable at their owner (a manifest carries them)."""
        return []

    def pending_evals(self, step: int) -> list[EvalEntry]:
        return []

    def lag_steps(self) -> int:
        """How many step records the owner has not acknowledged yet."""
        return 0

    def connected(self) -> bool | None:
        """Whether the proxy answers (None without one)."""
        return None

    def rollback_target(self, step: int, phase: int) -> tuple[int, int] | None:
        """(phase, the step it starts after) when a pivot started a phase whose first step this
        trainer already trained under `phase`; None otherwise."""
        return None

    def acknowledged(self) -> bool:
        """Whether every record so far is durable at its owner (a pivot's hold waits for it)."""
        return True

    def restart_after(self, step: int, new_segment: bool = False) -> None:
        """Forget every arm assigned after `step` (a pivot); `new_segment`: after a roll-back."""

    def enter_phase(self, phase: messages.NewPhase) -> None:
        """Take the phase the proxy released a pivot's hold with: the arms after its start come
        from it (rank 0's link; the other ranks take their arms from rank 0)."""

    def retry_unlogged(self) -> bool:
        """Write the `unlogged` record once more; True once it is durable."""
        return True

    def close(self) -> None:
        """Flush what is outstanding and release the files or the link."""


class RecordLogRefused(Exception):
    """Fixed mode: `.loss.json` or `.eval.json` is not a (possibly torn) log of records — another
    kind of file, or damaged before its tail. The same file fails every start: exit 4, as the
    proxy does with its own."""


class FileSink(RecordSink):
    """Fixed mode, rank 0: the trainer's own `.loss.json` and `.eval.json`."""

    def __init__(self, run_dir: Path, mixture: FixedMixture) -> None:
        super().__init__(mixture)
        self.loss_path = run_dir / LOSS_FILE
        self.losslog = LossLog.open(self.loss_path)
        try:
            self.evallog = EvalLog.open(run_dir / EVAL_FILE)
        except BaseException:
            self.losslog.close()
            raise
        #: Records of the steps after the `unlogged` one, written after it.
        self._held: list[LossEntry] = []

    @classmethod
    def open(cls, run_dir: Path, mixture: FixedMixture, prior_segment: int) -> tuple[FileSink, int]:
        """The sink, and the number of this life's segment: one more than any segment the
        checkpoint (`prior_segment`) or the log knows. RecordLogRefused when either file cannot
        be a log."""
        try:
            return cls(run_dir, mixture), next_segment(run_dir, prior_segment)
        except LossLogError as e:
            raise RecordLogRefused(
                f"{e}. The trainer writes no records over it: move it aside (a damaged log: "
                "keep it for a person to look at, restored from a backup if there is one) and "
                "start again"
            ) from None

    def record_loss(self, entry: LossEntry) -> bool:
        if self.unlogged is not None:
            # A record after one that failed waits for it: the log stays in step order.
            self._held.append(entry)
            return False
        try:
            self.losslog.append(entry)
        except OSError as e:
            log.error("cannot append the loss of step %d to %s: %s", entry.step, LOSS_FILE, e)
            self.unlogged = entry
            return False
        return True

    def record_eval(self, entry: EvalEntry) -> None:
        self.evallog.append(entry)

    def sync(self) -> None:
        # The loss history reaches the disk no later than the weights (an fsync of the log's
        # descriptor; the main thread only appends).
        try:
            self.losslog.sync()
        except LossLogError as e:  # an append failed: this checkpoint must not commit
            raise OSError(f"{LOSS_FILE} is not durable: {e}") from e
        try:
            self.evallog.sync()
        except LossLogError as e:
            raise OSError(f"{EVAL_FILE} is not durable: {e}") from e

    def retry_unlogged(self) -> bool:
        """Reopen the loss log (repairing the torn append) and write the entry that failed, then
        the ones held after it."""
        assert self.unlogged is not None
        try:
            self.losslog.close()
            self.losslog = LossLog.open(self.loss_path)
            while self.unlogged is not None:
                self.losslog.append(self.unlogged)
                self.unlogged = self._held.pop(0) if self._held else None
            self.losslog.sync()
        except (OSError, LossLogError) as e:
            log.error("%s is still not writable: %s", LOSS_FILE, e)
            return False
        return True

    def close(self) -> None:
        self.losslog.close()
        self.evallog.close()


class ProxySink(RecordSink):
    """Proxy mode, rank 0: the proxy link, whose records are kept until the proxy acknowledges
    them (and carried by the manifests until then)."""

    def __init__(self, link: ProxyLink, counters: Counters, arm_index: dict[str, int]) -> None:
        super().__init__()
        self.link = link
        self.counters = counters
        self.arm_index = arm_index
        #: The probe each assignment asked for, until its step is trained.
        self._probe_of: dict[int, list[str]] = {}

    def arm_for(self, step: int) -> int | None:
        """The proxy's assignment if it arrives within 0.25 s; it also says the segment (the
        proxy numbers the segments) and the phase."""
        a = self.link.assignment(step, timeout=0.25)
        segment = self.link.segment
        if a is None or segment is None:  # the proxy numbers the segment before it assigns
            return None
        if (
            a.phase != self.counters.phase
            and self.link.rollback_target(self.counters.step, self.counters.phase) is not None
        ):
            # The reply that told of a pivot this trainer ran past may carry the new phase's arms
            # (a restarted proxy answers a request queued before its hello). Trained on top of the
            # old phase's steps, they would mix two phases in one trajectory: the roll-back
            # (PhaseFollower.follow) comes first, and the arms are asked for again after it.
            return None
        self.counters.segment = segment
        self.counters.phase = a.phase
        self._probe_of = {s: p for s, p in self._probe_of.items() if s >= step - 1}
        if a.probe:
            self._probe_of[step] = list(a.probe)
        else:
            self._probe_of.pop(step, None)
        return self.arm_index[a.arm]

    def probe_for(self, step: int) -> list[str] | None:
        return self._probe_of.get(step)

    def record_loss(self, entry: LossEntry) -> bool:
        self.link.submit_loss(entry)
        return True

    def record_eval(self, entry: EvalEntry) -> None:
        self.link.submit_eval(entry)

    def record_samples(self, report: messages.SampleReport) -> None:
        self.link.submit_samples(report)

    def pending_losses(self, step: int) -> list[LossEntry]:
        return [e for e in self.link.unacknowledged() if e.step <= step]

    def pending_evals(self, step: int) -> list[EvalEntry]:
        return [e for e in self.link.unacknowledged_evals() if e.step <= step]

    def lag_steps(self) -> int:
        return len(self.link.unacknowledged())

    def connected(self) -> bool | None:
        return self.link.connected()

    def rollback_target(self, step: int, phase: int) -> tuple[int, int] | None:
        return self.link.rollback_target(step, phase)

    def acknowledged(self) -> bool:
        return self.link.wait_acknowledged(timeout=0.0)

    def restart_after(self, step: int, new_segment: bool = False) -> None:
        self.link.restart_after(step, new_segment=new_segment)

    def enter_phase(self, phase: messages.NewPhase) -> None:
        self.link.enter_phase(phase)

    def close(self) -> None:
        # Unacknowledged records are in the final manifest; waiting briefly just saves a resend.
        self.link.wait_acknowledged(timeout=1.0)
        self.link.close()


def open_sink(ctx: TrainerContext, manifest: Manifest | None) -> RecordSink:
    """This rank's sink for the life that resumes from `manifest` (None: a fresh run). In fixed
    mode it numbers the life's segment; in proxy mode the link re-sends what the manifest holds pending."""
    cfg, run_dir, counters, parts = ctx.cfg, ctx.run_dir, ctx.counters, ctx.parts
    if not ctx.main:
        return RecordSink(parts.mixture if cfg.mixing == "fixed" else None)
    if cfg.mixing == "fixed":
        prior = manifest.progress.segment if manifest is not None else 0
        sink, counters.segment = FileSink.open(run_dir, parts.mixture, prior)
        return sink
    # The proxy owns .loss.json and numbers the segments (it sees every life's records).
    counters.segment = _provisional_segment(run_dir, manifest)
    link = ProxyLink(
        peer_endpoint(run_dir, "proxy"), counters.step, cfg.seed, [a.name for a in parts.arms]
    )
    for entry in manifest.pending_losses if manifest is not None else []:
        link.submit_loss(entry)
    for record in manifest.pending_evals if manifest is not None else []:
        link.submit_eval(record)
    link.start()
    return ProxySink(link, counters, parts.arm_index)


def _provisional_segment(run_dir: Path, manifest: Manifest | None) -> int:
    """Proxy mode: the segment a checkpoint records if one is taken before the proxy has numbered
    this life's (a stop after an accepted config change rewrites the resumed step): one more than
    any segment the checkpoint or the log knows, as fixed mode numbers it. A segment of its own,
    so that the resume check never compares the cursors with draws of the earlier segments, made
    under the old config (checkpoint/training/crosscheck.py). The proxy's number replaces it at the first
    assignment; 0 for a fresh run, which has nothing to checkpoint before its first step."""
    if manifest is None:
        return 0
    try:
        return next_segment(run_dir, manifest.progress.segment)
    except (LossLogError, OSError):
        # The proxy repairs or refuses its log; the checkpoint's own segment still counts.
        return manifest.progress.segment + 1


def next_segment(run_dir: Path, prior_segment: int) -> int:
    """One more than any segment the checkpoint (`prior_segment`) or the loss log's tail knows.
    LossLogError when the log cannot be read as one."""
    loss_path = run_dir / LOSS_FILE
    tail = last_entry(loss_path) if loss_path.exists() else None
    return max(prior_segment, tail.segment if tail else 0) + 1
