"""andrea-proxy: owns the data-mixing bandit and the run's audit trail.

It serves one ROUTER socket (the trainer's link and andreactl's control requests), and owns four
files in the run directory:
- `.loss.json`: every trained step, appended and fsync'd before the trainer is told (acknowledged);
- `.eval.json`: every held-out evaluation, with the same guarantees;
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
from andrea.protocol.status import ProxyStatus, RewardReport, Zombie
from andrea.protocol.transport import bind_router, close_router

from .. import rundir
from ..boundedio import read_bounded
from ..checkpoint.manager import checkpoint_steps, read_manifest, verify_checkpoint
from ..config import ConfigError, RunConfig, build_config, config_changes, load_toml
from ..data import DataError, arm_identity
from ..durable import atomic_write_bytes
from ..dutycycle import Burst
from ..evallog import EvalLog, last_eval
from ..exitcodes import ExitCode
from ..logthrottle import ThrottledWarning
from ..losslog import LossLog, canonical_curve, read_entries
from ..metrics.prometheus import exposition_for
from ..process import Notifier, SignalFlags
from ..rundir import (
    EVAL_FILE,
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
from ..validation import first_problem
from .assignbook import AssignmentBook
from .bandit import Bandit, BanditError, BanditState, ConfiguredArm, PhaseCounters, ZombieReport
from .policy import Policy, PolicyError, bounds_table, differences, parse_policy
from .policystore import store, with_reward

log = logging.getLogger(__name__)

STATE_EVERY = 100
#: The trainer's link: handled as soon as they arrive. Everything else (status, pivot) is served in
#: bursts at a bounded duty cycle (daemon/dutycycle.py), with up to MAX_DEFERRED_CONTROL requests
#: queued (clients retry what is dropped beyond that).
LINK_MESSAGES = (m.Hello, m.AssignRequest, m.LossReport, m.SampleReport)
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
    live_reward: RewardReport | None = None  # absent from states written before the reward choice


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
    #: Text to make the run's policy file before starting (a first start, or `--policy --pivot`).
    policy_text: str | None = None
    #: Where `cfg` was read, to re-read after a deliberate config change (--allow-config-change).
    config_path: Path | None = None


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
        if self.opts.policy_text is not None:
            self._check_policy(self.opts.policy)
            store(self.run_dir, self.opts.policy_text)
        self.losslog = LossLog.open(self.run_dir / LOSS_FILE)
        self.evallog = EvalLog.open(self.run_dir / EVAL_FILE)
        self.last_eval = last_eval(self.run_dir / EVAL_FILE)
        entries = read_entries(self.run_dir / LOSS_FILE)
        self._check_log_against_checkpoints({e.step for e in entries})
        bandit, self.max_segment = self._restore_bandit(max((e.step for e in entries), default=0))
        self.book = AssignmentBook(bandit, self.configured, starts=phase_starts(self.run_dir))
        self.durable_step = self.trainer_step = superseded = 0
        for e in entries:
            if self.book.record(e.step, e.arm, e.loss, e.phase):
                self.durable_step = max(self.durable_step, e.step)
            else:
                superseded += 1
            if e.segment > self.max_segment:
                self.max_segment, self.trainer_step = e.segment, e.step
            elif e.segment == self.max_segment:
                self.trainer_step = max(self.trainer_step, e.step)
        if superseded:
            log.info("%d logged entries are superseded by pivots (kept, not counted)", superseded)
        self.samples = self._load_samples()
        self.board = None
        if self.opts.cfg.metrics.tensorboard:
            from ..metrics.tensorboard import LiveBoard

            self.board = LiveBoard(self.run_dir / TENSORBOARD_DIR, canonical_curve(entries))
        self.prometheus = exposition_for(self.opts.cfg.metrics, "proxy", self.run_dir)
        if self._policy_changed:
            self._manual_pivot()
        self.steps_since_state = 0
        self.mix_since_sample: dict[str, int] = {}
        self.ctx = zmq.Context.instance()
        self.endpoint = endpoint(self.run_dir, "proxy")
        self.sock = bind_router(self.ctx, self.endpoint)
        self._write_state()
        log.info("proxy ready: %d logged entries, up to step %d", len(entries), self.durable_step)

    def _check_policy(self, policy: Policy) -> None:
        """A new policy must name only this run's arms and be feasible over the live ones."""
        policy.check_arms(c.name for c in self.configured)
        policy.check_feasible(c.name for c in self.configured if c.available)

    def _manual_pivot(self) -> None:
        """The policy file changed while the proxy was stopped: the seed's manual pivot. Its
        boundary is the trainer's newest intact checkpoint, where `andreactl pivot` would have held
        it. Steps the trainer trained after it under the old policy stay in .loss.json, superseded;
        the trainer rolls back to the boundary by itself when it hears of the new phase."""
        old = self.book.bandit.policy
        self._check_policy(self.opts.policy)
        boundary = None
        for step in checkpoint_steps(self.run_dir):
            if step < self.book.phase_start:
                break
            try:
                verify_checkpoint(self.run_dir, step)
            except ValueError as e:
                log.warning("checkpoint %d cannot be a pivot point: %s", step, e)
                continue
            boundary = step
            break
        if boundary is None:
            raise PolicyError(
                f"{POLICY_FILE} differs from the policy of phase {self.book.bandit.phase} (a pivot), "
                f"but no intact checkpoint at or after the phase's start (step {self.book.phase_start}) "
                "can be its boundary; let the trainer write one (SIGUSR1) and start the proxy again"
            )
        log.info(
            "%s changed while the proxy was stopped (%s): a pivot after the newest checkpoint, step %d",
            POLICY_FILE,
            "; ".join(differences(old, self.opts.policy)) or "same bounds",
            boundary,
        )
        if self.durable_step > boundary:
            log.info(
                "steps %d..%d were trained under the old policy: they stay in %s as superseded "
                "entries and the trainer rolls back to step %d",
                boundary + 1,
                self.durable_step,
                LOSS_FILE,
                boundary,
            )
        self._pivot(boundary, self.opts.policy)
        self.durable_step = min(self.durable_step, boundary)

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
            live_reward=bandit.reward_report(),
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
        if isinstance(msg, m.EvalReport):
            return self._eval(msg)
        if isinstance(msg, m.SampleReport):
            return self._samples(msg)
        if isinstance(msg, m.StatusRequest):
            return m.Reply(id=msg.id, ok=True, data=json.loads(self.status().model_dump_json()))
        if isinstance(msg, m.PivotRequest):
            return self._pivot_request(msg)
        if isinstance(msg, (m.CheckpointRequest, m.StopRequest, m.ResumeRequest)):
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"'{msg.type}' is a trainer command; send it to the trainer",
            )
        return m.Reply(id=msg.id, ok=False, error=f"unexpected message type {msg.type!r}")

    def _reload_config(self) -> None:
        """The trainer may have recorded a deliberate change in run.toml (--allow-config-change)
        since this proxy read it: take a changed seed or arm set from there. The running phase's
        bandit keeps its own seed (its draws so far are in .state.json); a removed arm becomes a
        zombie, an added one joins with a fresh reward."""
        path = self.opts.config_path
        if path is None:
            return
        try:
            cfg = build_config(load_toml(path), source=str(path))
        except (ConfigError, OSError) as e:
            log.warning("cannot re-read %s: %s", path, e)
            return
        if cfg.trajectory() == self.opts.cfg.trajectory():
            return
        log.warning(
            "%s changed since the proxy started: %s",
            path.name,
            "; ".join(config_changes(self.opts.cfg.trajectory(), cfg.trajectory())),
        )
        self.opts.cfg = cfg
        self.configured = configured_arms(cfg, self.run_dir)
        self.book.configured = list(self.configured)
        self.book.bandit = Bandit.from_state(self.book.bandit.state_dict(), self.configured)

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
        if msg.seed != self.opts.cfg.seed or set(self.book.bandit.live_arms) - set(msg.arms):
            self._reload_config()
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
            self.trainer_step = msg.resume_step
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
            phases=self._phases(),
        )

    def _phases(self) -> list[m.PhaseStart]:
        return [m.PhaseStart(phase=p, after_step=s) for p, s in sorted(self.book.starts.items())]

    def _assign(self, msg: m.AssignRequest) -> m.Message:
        items, waiting = [], None
        for step in range(msg.from_step, msg.from_step + msg.count):
            arm = self.book.assign(step)
            if arm is None:
                waiting = self.book.waiting_for(step)
                break
            items.append(m.Assignment(step=step, arm=arm, phase=self.book.phase_of(step)))
        return m.Assignments(
            id=msg.id, items=items, waiting_for_step=waiting, phases=self._phases()
        )

    def _entry_problem(self, e: LossEntry) -> str | None:
        """Why `e` cannot be a record of a step the trainer trained, judged against this proxy's
        own state; None when it can. A genuine trainer trains only arms this proxy assigned, and
        an assignment needs the losses it depends on to be durable here already, so the arm of
        every genuine step can be recomputed now (and is the same: assignments are pure)."""
        if e.segment > self.max_segment:
            return f"step {e.step}: segment {e.segment} was never numbered (highest: {self.max_segment})"
        if e.phase > self.book.bandit.phase:
            return f"step {e.step}: phase {e.phase} is after the current phase {self.book.bandit.phase}"
        if e.phase < self.book.phase_of(e.step):
            # Superseded: trained past a pivot's boundary under the old phase (the manual pivot,
            # before the trainer rolled back). Kept in the log, counted by nothing; the old phase's
            # bandit that assigned it is archived, so only its arm can be checked.
            if e.arm not in {c.name for c in self.configured}:
                return f"step {e.step}: arm {e.arm!r} is not an arm of this run"
            return None
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
            if self.book.record(e.step, e.arm, e.loss, e.phase):
                self.durable_step = max(self.durable_step, e.step)
                self.mix_since_sample[e.arm] = self.mix_since_sample.get(e.arm, 0) + 1
            else:
                log.debug(
                    "step %d of phase %d is superseded by a pivot; logged, not counted",
                    e.step,
                    e.phase,
                )
            self.max_segment = max(self.max_segment, e.segment)
            if e.segment == self.max_segment:
                self.trainer_step = max(self.trainer_step, e.step)
        self.steps_since_state += written
        if self.steps_since_state >= STATE_EVERY:
            self._write_state()
        if self.board is not None:
            self.board.log(
                msg.entries, self.book.bandit.probabilities(), self.book.bandit.rewards()
            )
        self._publish_metrics()
        return m.LossAck(id=msg.id, keys=[(e.segment, e.step) for e in msg.entries])

    def _eval(self, msg: m.EvalReport) -> m.Message:
        e = msg.entry
        if self.evallog.append(e):
            self.evallog.sync()  # acknowledged means durable
            self.last_eval = e
            name, worst = e.worst()
            log.info(
                "held-out loss at step %d (segment %d): mean %.4f, worst %s %.4f",
                e.step,
                e.segment,
                e.mean_loss(),
                name,
                worst,
            )
        return m.EvalAck(id=msg.id, key=(e.segment, e.step))

    def _samples(self, msg: m.SampleReport) -> m.Message:
        if msg.segment > self.max_segment or msg.phase > self.book.bandit.phase:
            error = f"samples of segment {msg.segment}, phase {msg.phase}: never numbered"
            self.rejections.warning("rejected a sample report: %s", error)
            return m.Reply(id=msg.id, ok=False, error=error)
        owner = self.book.phase_of(msg.step)
        if msg.phase != owner:
            log.info(
                "samples of step %d (phase %d) are superseded by the pivot to phase %d; not kept",
                msg.step,
                msg.phase,
                owner,
            )
        elif msg.phase != self.book.bandit.phase:
            self._archive_samples(msg)
        elif not any(r.step == msg.step and r.segment == msg.segment for r in self.samples.records):
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

    def _archive_samples(self, msg: m.SampleReport) -> None:
        """Samples of a step of an ended phase that arrive after its pivot (re-sent by a trainer
        that was cut off from the proxy) join that phase's archive: the sample of a boundary
        belongs to the phase that ends there."""
        archive = archive_of_phase(self.run_dir, msg.phase)
        if archive is None:
            log.warning("samples of step %d: no archive of phase %d; not kept", msg.step, msg.phase)
            return
        path = archive / SAMPLES_FILE
        try:
            kept = SamplesFile.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            kept = SamplesFile(kept=SAMPLES_KEPT, records=[])
        if any(r.step == msg.step and r.segment == msg.segment for r in kept.records):
            return
        rec = SampleRecord(
            step=msg.step,
            segment=msg.segment,
            phase=msg.phase,
            received_utc=now_utc(),
            arm_mix={},
            samples=msg.samples,
        )
        kept.records = (kept.records + [rec])[-kept.kept :]
        atomic_write_bytes(path, kept.model_dump_json(indent=1).encode())
        log.info("samples of step %d joined the archive of phase %d", msg.step, msg.phase)

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
        n = 1
        while archive.exists():  # a second pivot at the same step within the same second
            n += 1
            archive = pivot_archive(self.run_dir, boundary, f"{stamp}-{n}")
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
        """Check everything before anything happens; a refusal changes nothing. A re-sent request
        for a pivot already made (same boundary, same policy) is answered as done."""

        def refuse(error: str, **data: object) -> m.Message:
            return m.Reply(id=msg.id, ok=False, error=error, data=data)

        try:
            policy, policy_toml = with_reward(
                parse_policy(msg.policy_toml, source="pivot policy"),
                msg.policy_toml,
                self.book.bandit.policy.reward,
            )
            self._check_policy(policy)
        except PolicyError as e:
            return refuse(str(e), kind="policy")
        b, bandit = msg.boundary_step, self.book.bandit
        current = bandit.policy
        table = bounds_table(current, policy, [c.name for c in self.configured])
        data: dict[str, object] = {
            "phase": bandit.phase,
            "phase_start_step": bandit.phase_start_step,
            "boundary_step": b,
            "old_policy": current.fingerprint(),
            "new_policy": policy.fingerprint(),
            "bounds": table,
            "changes": differences(current, policy),
            "live_arms": bandit.live_arms,
        }
        same = current.fingerprint() == policy.fingerprint()
        if same and bandit.phase > 0 and bandit.phase_start_step == b and not msg.dry_run:
            archive = archive_of_phase(self.run_dir, bandit.phase - 1)
            return m.Reply(
                id=msg.id,
                ok=True,
                data={
                    **data,
                    "already": True,
                    "archive": str(archive.relative_to(self.run_dir)) if archive else None,
                },
            )
        if same and not msg.force:
            return refuse(
                f"the run already uses this policy (fingerprint {policy.fingerprint()[:12]}…, phase "
                f"{bandit.phase}): a pivot would change nothing; pass --force for a new phase anyway",
                kind="no-op",
                **data,
            )
        if b < self.book.phase_start:
            return refuse(
                f"cannot pivot after step {b}: phase {bandit.phase} starts after step "
                f"{self.book.phase_start}",
                kind="boundary",
                **data,
            )
        if msg.dry_run:
            return m.Reply(id=msg.id, ok=True, data={**data, "dry_run": True})
        if b > self.trainer_step:
            return refuse(
                f"cannot pivot after step {b}: it is beyond the trainer's progress (its losses are "
                f"logged up to step {self.trainer_step})",
                kind="boundary",
                **data,
            )
        if b < self.trainer_step:
            return refuse(
                f"cannot pivot after step {b}: the trainer has already trained up to step "
                f"{self.trainer_step} under the current policy",
                kind="boundary",
                **data,
            )
        if b == self.book.phase_start and self.book.bandit.phase > 0:
            return m.Reply(
                id=msg.id,
                ok=False,
                error=f"phase {self.book.bandit.phase} already starts after step {b}",
            )
        # The policy file first: if the proxy dies before the new state is written, its next start
        # sees the changed policy and completes the same pivot (at the newest checkpoint, b).
        store(self.run_dir, policy_toml)
        archive = self._pivot(b, policy)
        return m.Reply(
            id=msg.id,
            ok=True,
            data={
                **data,
                "phase": self.book.bandit.phase,
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
            trainer_step=self.trainer_step,
            last_eval=self.last_eval,
            reward=b.reward_report(),
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
                burst = Burst()
                while deferred and not burst.spent():
                    peer, msg = deferred.popleft()
                    if not self._answer(peer, msg):
                        return
                not_before = time.monotonic() + burst.pause()
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
        self.evallog.close()
        close_router(self.sock, self.endpoint)
        self._lock.close()  # the run directory is free for the next proxy
        log.info("proxy stopped; state written at durable step %d", self.durable_step)


def _pivot_records(run_dir: Path) -> list[tuple[Path, dict]]:
    out = []
    for record in pivot_records(run_dir):
        out.append((record.parent, json.loads(record.read_text())))
    return out


def phase_starts(run_dir: Path) -> dict[int, int]:
    """Phase → the step after which it starts, from the pivot records under archive/."""
    return {int(d["new_phase"]): int(d["boundary_step"]) for _, d in _pivot_records(run_dir)}


def archive_of_phase(run_dir: Path, phase: int) -> Path | None:
    """The archive of the phase that ended at a pivot (the newest, should there be several)."""
    found = [(d["utc"], a) for a, d in _pivot_records(run_dir) if int(d["old_phase"]) == phase]
    return max(found)[1] if found else None


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
        raise ValueError(f"{path.name}: not a valid proxy state ({first_problem(e)})") from None
