"""andrea-proxy: owns the data-mixing bandit and the run's audit trail.

It serves one ROUTER socket (the trainer's link and andreactl's control requests), and owns three
files in the run directory:
- `.loss.json`: every trained step, appended and fsync'd before the trainer is told (acknowledged);
- `.samples.json`: the most recent generated samples, with the arm mix that led to them;
- `.state.json`: the bandit (a snapshot old enough to restart from, see `assignbook`), the policy,
  phase counters, zombie arms and the live probabilities — rewritten atomically every
  `STATE_EVERY` logged steps and on exit.

A restart of the proxy never stops, rewinds or confuses the trainer: the trainer holds its loss
records until they are acknowledged and re-sends them, and every assignment is recomputed
identically (see `assignbook`).
"""

from __future__ import annotations

import errno
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import tomli_w
import zmq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.protocol import messages as m
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.status import ProxyStatus, Zombie
from andrea.protocol.transport import bind_router, close_router

from .. import rundir
from ..boundedio import read_bounded
from ..checkpoint.durable import atomic_write_bytes
from ..checkpoint.manager import checkpoint_steps, read_manifest
from ..config import RunConfig
from ..data import DataError, arm_identity
from ..exitcodes import ExitCode
from ..logthrottle import ThrottledWarning
from ..losslog import LossLog, canonical_curve, read_entries
from ..metrics.prometheus import exposition_for
from ..process import Notifier, SignalFlags
from ..rundir import (
    LOSS_FILE,
    PIVOT_RECORD,
    POLICY_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    TENSORBOARD_DIR,
    claim,
    corrupt_name,
    endpoint,
    pivot_archive,
    pivot_records,
)
from .assignbook import AssignmentBook
from .bandit import Bandit, BanditError, BanditState, ConfiguredArm, PhaseCounters, ZombieReport
from .policy import Policy, PolicyError, parse_policy

log = logging.getLogger(__name__)

STATE_EVERY = 100
#: The trainer's link: handled as soon as they arrive. Everything else (status, pivot) is served at
#: most CONTROL_DUTY of the proxy's CPU time, with up to MAX_DEFERRED_CONTROL requests queued
#: (clients retry what is dropped beyond that).
LINK_MESSAGES = (m.Hello, m.AssignRequest, m.LossReport, m.SampleReport)
CONTROL_DUTY = 0.02
MAX_DEFERRED_CONTROL = 1000
SAMPLES_KEPT = 20
#: What these files can hold (a few hundred arms of state; 1,000 records of 64 samples of at most
#: 17 KiB): a larger file is refused before it is read.
MAX_STATE_BYTES = 16 << 20
MAX_SAMPLES_BYTES = 64 << 20


class ProxyState(BaseModel):
    """`.state.json`. `bandit` is the bandit as of step `bandit.last_step`, deliberately at least
    W - 1 steps behind `durable_step` so that a restarted proxy can recompute every assignment it
    may still owe; the `live_*` fields describe the bandit at the moment of writing, for people."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["andrea-proxy-state/1"] = "andrea-proxy-state/1"
    written_utc: str
    durable_step: int = Field(ge=0, description="every loss up to here is in .loss.json")
    max_segment: int = Field(ge=0)
    bandit: BanditState
    live_counters: PhaseCounters
    live_probabilities: dict[str, float]
    zombies: list[ZombieReport]


class SampleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int
    segment: int
    phase: int
    received_utc: str
    arm_mix: dict[str, int] = Field(description="steps per arm since the previous sample")
    samples: list[m.Sample]


class SamplesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["andrea-samples/1"] = "andrea-samples/1"
    kept: int = Field(ge=1, le=1000)
    records: list[SampleRecord] = Field(max_length=1000)


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def configured_arms(cfg: RunConfig, run_dir: Path) -> list[ConfiguredArm]:
    """Each configured source with its identity and whether it is available right now."""
    out = []
    for spec in cfg.data.arms:
        try:
            identity = arm_identity(spec, cfg.data, run_dir, cfg.model.vocab_size)
            out.append(ConfiguredArm(spec.name, identity, True))
        except DataError as e:
            log.warning("arm %r is not available: %s", spec.name, e)
            out.append(ConfiguredArm(spec.name, "", False))
    return out


@dataclass
class ProxyOptions:
    run_dir: Path
    cfg: RunConfig
    policy: Policy


class Proxy:
    def __init__(
        self, opts: ProxyOptions, flags: SignalFlags, notifier: Notifier | None = None
    ) -> None:
        self.opts = opts
        self.run_dir = opts.run_dir
        self.flags = flags
        self.notifier = notifier or Notifier()
        self.segments: dict[bytes, int] = {}
        self.rejections = ThrottledWarning(log)
        self.exit_code = ExitCode.OK

    # ---- setup ------------------------------------------------------------------------------

    def setup(self) -> None:
        self._lock = claim(self.run_dir, "proxy")
        self._policy_changed = False
        self.configured = configured_arms(self.opts.cfg, self.run_dir)
        self.losslog = LossLog.open(self.run_dir / LOSS_FILE)
        entries = read_entries(self.run_dir / LOSS_FILE)
        self._check_log_against_checkpoints({e.step for e in entries})
        bandit, self.max_segment = self._restore_bandit(max((e.step for e in entries), default=0))
        self.book = AssignmentBook(bandit, self.configured)
        for e in entries:
            self.book.record(e.step, e.arm, e.loss)
            self.max_segment = max(self.max_segment, e.segment)
        self.durable_step = max((e.step for e in entries), default=0)
        self.samples = self._load_samples()
        self.board = None
        if self.opts.cfg.metrics.tensorboard:
            from ..metrics.tensorboard import LiveBoard

            self.board = LiveBoard(self.run_dir / TENSORBOARD_DIR, canonical_curve(entries))
        self.prometheus = exposition_for(self.opts.cfg.metrics, "proxy", self.run_dir)
        if self._policy_changed:
            # The policy file changed while the proxy was stopped: the manual pivot. Its boundary
            # is the trainer's newest checkpoint, exactly where `andreactl pivot` would have held it.
            boundary = max(checkpoint_steps(self.run_dir), default=None)
            if boundary is None or self.durable_step > boundary or boundary < self.book.phase_start:
                raise ValueError(
                    f"the policy differs from the running phase's, but the newest checkpoint ({boundary}) "
                    f"is not a possible pivot point (steps logged up to {self.durable_step}, phase from "
                    f"{self.book.phase_start}); stop the trainer first (its final checkpoint is the boundary) "
                    "or use `andreactl pivot --policy FILE` while it runs"
                )
            self._pivot(boundary, self.opts.policy)
        self.steps_since_state = 0
        self.mix_since_sample: dict[str, int] = {}
        self.ctx = zmq.Context.instance()
        self.endpoint = endpoint(self.run_dir, "proxy")
        self.sock = bind_router(self.ctx, self.endpoint)
        self._write_state()
        log.info("proxy ready: %d logged entries, up to step %d", len(entries), self.durable_step)

    def _check_log_against_checkpoints(self, logged: set[int]) -> None:
        """Refuse a .loss.json that lacks steps the trainer's newest checkpoint says were trained
        (a truncated or replaced log): the trainer would resume there and wait forever for
        assignments that need those losses. A checkpoint may legitimately be ahead of the log
        by the records the proxy had not acknowledged; those travel in its manifest."""
        for step in checkpoint_steps(self.run_dir):
            try:
                manifest = read_manifest(self.run_dir, step)
            except (ValueError, OSError):
                continue  # damaged: the trainer skips it too
            if manifest.mixing.mode != "proxy":
                return
            pending = {e.step for e in manifest.pending_losses}
            first = last_pivot(self.run_dir)[1] + 1  # earlier phases' steps are not replayed
            missing = [s for s in range(first, step + 1) if s not in logged and s not in pending]
            if missing:
                raise LogContradiction(
                    f"{LOSS_FILE} lacks the losses of {len(missing)} steps ({_ranges(missing)}) that"
                    f" checkpoint {rundir.bin_name(step)} says were trained and acknowledged: the log"
                    " was truncated or replaced. Restore it from a backup; the proxy will not run on"
                    " a log that contradicts the checkpoints"
                )
            return

    def _restore_bandit(self, logged_up_to: int) -> tuple[Bandit, int]:
        """The bandit from .state.json, or a fresh one that replays .loss.json.

        The fresh bandit is not a reset: assignments are a pure function of the logged losses, so
        replaying them from the phase start rebuilds exactly the bandit the state file held. That
        is also the documented recovery from a damaged state file (moved aside, never deleted).
        """
        path = self.run_dir / STATE_FILE
        if path.exists():
            try:
                state = parse_state_file(path)
                _check_state(state, self.opts.cfg.seed, logged_up_to)
                bandit = Bandit.from_state(state.bandit, self.configured)
            except (ValueError, BanditError) as e:
                bad = path.with_name(corrupt_name(STATE_FILE, int(time.time())))
                path.rename(bad)
                log.warning(
                    "%s; moved to %s and rebuilding the bandit from .loss.json", e, bad.name
                )
            else:
                log.info(
                    "bandit restored from %s at step %d (phase %d)",
                    path.name,
                    bandit.last_step,
                    bandit.phase,
                )
                self._policy_changed = (
                    state.bandit.policy_fingerprint != self.opts.policy.fingerprint()
                )
                return bandit, state.max_segment
        phase, start = last_pivot(self.run_dir)
        bandit = Bandit(
            self.configured,
            self.opts.policy,
            seed=self.opts.cfg.seed,
            phase=phase,
            start_step=start,
        )
        log.info(
            "bandit for phase %d (after step %d) over arms %s; logged losses are replayed as needed",
            phase,
            start,
            ", ".join(bandit.live_arms),
        )
        return bandit, 0

    def _load_samples(self) -> SamplesFile:
        path = self.run_dir / SAMPLES_FILE
        if path.exists():
            try:
                return SamplesFile.model_validate_json(read_bounded(path, MAX_SAMPLES_BYTES))
            except (ValidationError, ValueError, OSError) as e:
                why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
                bad = path.with_name(corrupt_name(SAMPLES_FILE, int(time.time())))
                path.rename(bad)
                log.warning(
                    "%s is not valid (%s); moved to %s, starting a new one",
                    path.name,
                    why,
                    bad.name,
                )
        return SamplesFile(kept=SAMPLES_KEPT, records=[])

    # ---- files ------------------------------------------------------------------------------

    def _write_state(self) -> None:
        bandit = self.book.bandit
        state = ProxyState(
            written_utc=now_utc(),
            durable_step=self.durable_step,
            max_segment=self.max_segment,
            bandit=self.book.persistable(self.durable_step),
            live_counters=bandit.counters(),
            live_probabilities=bandit.probabilities(),
            zombies=bandit.zombies,
        )
        atomic_write_bytes(self.run_dir / STATE_FILE, state.model_dump_json(indent=1).encode())
        self.steps_since_state = 0

    # ---- requests ---------------------------------------------------------------------------

    def handle(self, peer: bytes, msg: m.Message) -> m.Message | None:
        if isinstance(msg, m.Hello):
            return self._hello(peer, msg)
        if isinstance(msg, m.AssignRequest):
            return self._assign(msg)
        if isinstance(msg, m.LossReport):
            return self._losses(msg)
        if isinstance(msg, m.SampleReport):
            return self._samples(msg)
        if isinstance(msg, m.StatusRequest):
            return m.Reply(id=msg.id, ok=True, data=self.status().model_dump(mode="json"))
        if isinstance(msg, m.PivotRequest):
            return self._pivot_request(msg)
        if isinstance(msg, (m.CheckpointRequest, m.StopRequest, m.ResumeRequest)):
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"'{msg.type}' is a trainer command; send it to the trainer",
            )
        return m.Reply(id=msg.id, ok=False, error=f"unexpected message type {msg.type!r}")

    def _hello(self, peer: bytes, msg: m.Hello) -> m.Message:
        if msg.protocol != m.PROTOCOL:
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"protocol {msg.protocol}, this proxy speaks {m.PROTOCOL}",
            )
        if msg.segment is not None and msg.segment > self.max_segment + 1:
            # Segments are numbered here and made durable before the trainer hears them; one past
            # the highest known is the most a lost or older .state.json can hide.
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"segment {msg.segment} was never numbered (highest: {self.max_segment})",
            )
        if msg.seed != self.opts.cfg.seed:
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"trainer seed {msg.seed} differs from run.toml's {self.opts.cfg.seed}",
            )
        missing = sorted(set(self.book.bandit.live_arms) - set(msg.arms))
        if missing:
            return m.Reply(id=msg.id, ok=False, error=f"the trainer lacks live arms {missing}")
        if msg.segment is None:
            self.max_segment += 1
            segment = self.max_segment
            self._write_state()  # the number is durable before it is given out
            if msg.resume_step:
                log.info(
                    "trainer segment %d connected, resuming after step %d", segment, msg.resume_step
                )
            else:
                log.info("trainer segment %d connected, starting a fresh run", segment)
        else:
            segment = msg.segment
            if segment > self.max_segment:
                self.max_segment = segment
                self._write_state()
            log.info("trainer segment %d reconnected", segment)
        self.segments[peer] = segment
        b = self.book.bandit
        return m.Welcome(
            id=msg.id,
            segment=segment,
            phase=b.phase,
            phase_start_step=b.phase_start_step,
            lag=self.book.lag,
        )

    def _assign(self, msg: m.AssignRequest) -> m.Message:
        items, waiting = [], None
        for step in range(msg.from_step, msg.from_step + msg.count):
            arm = self.book.assign(step)
            if arm is None:
                waiting = self.book.waiting_for(step)
                break
            items.append(m.Assignment(step=step, arm=arm, phase=self.book.bandit.phase))
        return m.Assignments(id=msg.id, items=items, waiting_for_step=waiting)

    def _entry_problem(self, e: LossEntry) -> str | None:
        """Why `e` cannot be a record of a step the trainer trained, judged against this proxy's
        own state; None when it can. A genuine trainer trains only arms this proxy assigned, and
        an assignment needs the losses it depends on to be durable here already, so the arm of
        every genuine step can be recomputed now (and is the same: assignments are pure)."""
        if e.segment > self.max_segment:
            return f"step {e.step}: segment {e.segment} was never numbered (highest: {self.max_segment})"
        if e.phase > self.book.bandit.phase:
            return f"step {e.step}: phase {e.phase} is after the current phase {self.book.bandit.phase}"
        try:
            expected = self.book.assign(e.step)
        except ValueError as err:  # a step of an earlier phase that was never trained
            return f"step {e.step}: {err}"
        if expected is None:
            return f"step {e.step} was never assigned (the losses it depends on are not logged)"
        if e.arm != expected:
            return f"step {e.step} was assigned arm {expected!r}, not {e.arm!r}"
        return None

    def _losses(self, msg: m.LossReport) -> m.Message:
        for e in msg.entries:
            problem = self._entry_problem(e)
            if problem is not None:
                # Nothing of the message is written: one bad entry makes the whole report suspect.
                self.rejections.warning("rejected a loss report: %s", problem)
                return m.Reply(id=msg.id, ok=False, error=f"losses rejected: {problem}")
        written = self.losslog.append_many(msg.entries)
        self.losslog.sync()  # acknowledged means durable
        for e in msg.entries:
            self.book.record(e.step, e.arm, e.loss)
            self.max_segment = max(self.max_segment, e.segment)
            self.mix_since_sample[e.arm] = self.mix_since_sample.get(e.arm, 0) + 1
        if msg.entries:
            self.durable_step = max(self.durable_step, max(e.step for e in msg.entries))
        self.steps_since_state += written
        if self.steps_since_state >= STATE_EVERY:
            self._write_state()
        if self.board is not None:
            self.board.log(msg.entries, self.book.bandit.probabilities())
        self._publish_metrics()
        return m.LossAck(id=msg.id, keys=[(e.segment, e.step) for e in msg.entries])

    def _samples(self, msg: m.SampleReport) -> m.Message:
        if msg.segment > self.max_segment or msg.phase > self.book.bandit.phase:
            error = f"samples of segment {msg.segment}, phase {msg.phase}: never numbered"
            self.rejections.warning("rejected a sample report: %s", error)
            return m.Reply(id=msg.id, ok=False, error=error)
        if not any(r.step == msg.step and r.segment == msg.segment for r in self.samples.records):
            rec = SampleRecord(
                step=msg.step,
                segment=msg.segment,
                phase=msg.phase,
                received_utc=now_utc(),
                arm_mix=dict(sorted(self.mix_since_sample.items())),
                samples=msg.samples,
            )
            self.mix_since_sample = {}
            self.samples.records = (self.samples.records + [rec])[-self.samples.kept :]
            atomic_write_bytes(
                self.run_dir / SAMPLES_FILE, self.samples.model_dump_json(indent=1).encode()
            )
        return m.Reply(id=msg.id, ok=True)

    def _pivot(self, boundary: int, policy: Policy) -> Path:
        """Archive the ending phase, then start a fresh bandit for the steps after `boundary`.

        Crash-safe in this order: the archive is written from memory (the live files are not
        moved), then the new .state.json is the commit. A crash before it leaves the old state
        beside the new policy file, which the next start completes as a manual pivot at the same
        boundary (the trainer's newest checkpoint).
        """
        old = self.book.bandit
        self._write_state()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        archive = pivot_archive(self.run_dir, boundary, stamp)
        archive.mkdir(parents=True)
        for name in (STATE_FILE, SAMPLES_FILE):
            if (self.run_dir / name).exists():
                atomic_write_bytes(archive / name, (self.run_dir / name).read_bytes())
        atomic_write_bytes(
            archive / POLICY_FILE, tomli_w.dumps(old.policy.model_dump(mode="json")).encode()
        )
        record = {
            "boundary_step": boundary,
            "old_phase": old.phase,
            "new_phase": old.phase + 1,
            "old_policy": old.policy.fingerprint(),
            "new_policy": policy.fingerprint(),
            "utc": now_utc(),
        }
        atomic_write_bytes(archive / PIVOT_RECORD, json.dumps(record, indent=1).encode())
        bandit = Bandit(
            self.configured,
            policy,
            seed=self.opts.cfg.seed,
            phase=old.phase + 1,
            start_step=boundary,
        )
        self.book = self.book.next_phase(bandit)
        self.opts.policy = policy
        self._write_state()  # the commit point of the pivot
        self._publish_metrics(force=True)
        self.samples = SamplesFile(kept=SAMPLES_KEPT, records=[])
        atomic_write_bytes(
            self.run_dir / SAMPLES_FILE, self.samples.model_dump_json(indent=1).encode()
        )
        self.mix_since_sample = {}
        log.info(
            "pivot: phase %d starts after step %d under policy %s; phase %d archived in %s",
            bandit.phase,
            boundary,
            policy.fingerprint()[:12],
            old.phase,
            archive.relative_to(self.run_dir),
        )
        return archive

    def _pivot_request(self, msg: m.PivotRequest) -> m.Message:
        try:
            policy = parse_policy(msg.policy_toml, source="pivot policy")
            policy.check_feasible([c.name for c in self.configured if c.available])
        except PolicyError as e:
            return m.Reply(id=msg.id, ok=False, error=str(e))
        b = msg.boundary_step
        if b < self.book.phase_start or self.durable_step > b:
            return m.Reply(
                id=msg.id,
                ok=False,
                error=(
                    f"cannot pivot after step {b}: the phase starts after {self.book.phase_start} and steps up to "
                    f"{self.durable_step} are already logged under the current policy"
                ),
            )
        if b == self.book.phase_start and self.book.bandit.phase > 0:
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"phase {self.book.bandit.phase} already starts after step {b}",
            )
        # The policy file first: if the proxy dies before the new state is written, its next start
        # sees the changed policy and completes the same pivot.
        atomic_write_bytes(self.run_dir / POLICY_FILE, msg.policy_toml.encode())
        archive = self._pivot(b, policy)
        return m.Reply(
            id=msg.id,
            ok=True,
            data={
                "phase": self.book.bandit.phase,
                "boundary_step": b,
                "archive": str(archive.relative_to(self.run_dir)),
            },
        )

    def status(self) -> ProxyStatus:
        b = self.book.bandit
        return ProxyStatus(
            durable_step=self.durable_step,
            max_segment=self.max_segment,
            phase=b.phase,
            phase_start_step=b.phase_start_step,
            lag=self.book.lag,
            probabilities=b.probabilities(),
            zombies=[Zombie(**z.model_dump()) for z in b.zombies],
            policy_fingerprint=b.policy.fingerprint(),
        )

    # ---- loop -------------------------------------------------------------------------------

    def serve(self) -> None:
        """Answer requests until a stop is requested. The trainer's link messages are handled as
        they arrive; control requests (status, pivot) at a bounded duty cycle, queued meanwhile,
        so that clients polling status cannot take the CPU the trainer and its link need."""
        self.notifier.ready(f"serving, logged up to step {self.durable_step}")
        deferred: deque[tuple[bytes, m.Message]] = deque(maxlen=MAX_DEFERRED_CONTROL)
        not_before = 0.0
        while not self.flags.stop_requested():
            self.notifier.tick()
            if deferred and time.monotonic() >= not_before:
                peer, msg = deferred.popleft()
                t0 = time.thread_time()
                if not self._answer(peer, msg):
                    return
                busy = time.thread_time() - t0
                not_before = time.monotonic() + min(0.05, busy * (1 / CONTROL_DUTY - 1))
            wait = 100 if not deferred else max(0, int((not_before - time.monotonic()) * 1000))
            if not self.sock.poll(min(100, wait)):
                continue
            frames = self.sock.recv_multipart()
            peer, payload = frames[0], frames[-1]
            try:
                msg = m.decode(payload)
            except (ValidationError, ValueError) as e:
                self.rejections.warning(
                    "rejected an invalid message (%d bytes): %s",
                    len(payload),
                    str(e).splitlines()[0],
                )
                self.sock.send_multipart(
                    [peer, b"", m.encode(m.Reply(id="?", ok=False, error=f"invalid message: {e}"))]
                )
                continue
            if not isinstance(msg, LINK_MESSAGES):
                deferred.append((peer, msg))
            elif not self._answer(peer, msg):
                return
        log.info("stop requested (%s)", self.flags.stop_reason)

    def _publish_metrics(self, force: bool = False) -> None:
        if self.prometheus is None:
            return
        b = self.book.bandit
        self.prometheus.set(
            {
                "andrea_phase": b.phase,
                "andrea_logged_step": self.durable_step,
                "andrea_zombie_arms": len(b.zombies),
            }
        )
        self.prometheus.set_arm_probabilities(b.probabilities())
        self.prometheus.publish(force)

    def _answer(self, peer: bytes, msg: m.Message) -> bool:
        """Handle one request and send its reply; False when the proxy must stop (a write failed)."""
        try:
            reply = self.handle(peer, msg)
        except OSError as e:
            # A file could not be written. The request was not acknowledged, so the trainer
            # keeps its records; a restart repairs (.loss.json's tail, a pivot half done) and
            # goes on. A full disk is told apart: restarting before space is freed cannot help.
            full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            self.exit_code = ExitCode.CHECKPOINT_FAILED if full else ExitCode.FAILURE
            log.error(
                "cannot write the run's files (%s); stopping with exit code %d%s; nothing"
                " acknowledged is lost",
                e,
                self.exit_code,
                ": free space, then restart the proxy" if full else "",
            )
            return False
        if reply is not None:
            self.sock.send_multipart([peer, b"", m.encode(reply)])
        return True

    def close(self) -> None:
        if self.board is not None:
            self.board.close()
        self._publish_metrics(force=True)
        try:
            self._write_state()
        except OSError as e:  # the previous .state.json stays; a restart replays .loss.json
            log.error("could not write %s on exit: %s", STATE_FILE, e)
        self.losslog.close()
        close_router(self.sock, self.endpoint)
        self._lock.close()  # the run directory is free for the next proxy
        log.info("proxy stopped; state written at durable step %d", self.durable_step)


def last_pivot(run_dir: Path) -> tuple[int, int]:
    """(phase, boundary step) of the newest pivot recorded under archive/, or (0, 0)."""
    best = (0, 0)
    for record in pivot_records(run_dir):
        data = json.loads(record.read_text())
        best = max(best, (int(data["new_phase"]), int(data["boundary_step"])))
    return best


class LogContradiction(ValueError):
    """.loss.json contradicts the checkpoints: a person must restore it (exit 4)."""


def _ranges(steps: list[int]) -> str:
    out, start = [], steps[0]
    for a, b in zip(steps, steps[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out[:5]) + (", ..." if len(out) > 5 else "")


def _check_state(state: ProxyState, seed: int, logged_up_to: int) -> None:
    """A state file that contradicts the run's config or its log is damaged (moved aside, and
    the bandit rebuilt from the log, which is the ground truth)."""
    if state.bandit.seed != seed:
        raise ValueError(
            f"{STATE_FILE}: bandit seed {state.bandit.seed} is not run.toml's seed {seed}"
        )
    if state.durable_step > logged_up_to:
        raise ValueError(
            f"{STATE_FILE}: says every loss up to step {state.durable_step} is logged, but"
            f" {LOSS_FILE} ends at step {logged_up_to}"
        )


def parse_state_file(path: Path) -> ProxyState:
    """Read `.state.json` (a regular file of bounded size); raises ValueError naming the first
    problem."""
    try:
        return ProxyState.model_validate_json(read_bounded(path, MAX_STATE_BYTES))
    except OSError as e:
        raise ValueError(f"{path.name}: cannot be read ({e.strerror or e})") from None
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(file)"
        raise ValueError(f"{path.name}: not a valid proxy state ({loc}: {first['msg']})") from None
