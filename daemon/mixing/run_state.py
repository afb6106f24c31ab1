"""The proxy's state of a run, without its socket: the configured arms, the assignment book, how far
the log and the trainer have got, the kept samples and the metrics, and the files they are kept in.

Every write of it goes through here: `.loss.json` and `.eval.json` are appended and fsync'd before a
report is acknowledged; `.state.json` is rewritten atomically every `STATE_EVERY` logged steps, when
a segment number is given out (before the trainer hears it), at a pivot's commit point, at start
and on exit. The request handlers (`trainer_messages.py`, `phase_commit.py`,
`pivot_orchestrator.py`) check and decide; this carries out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from andrea.daemon.config import ConfigError, RunConfig, config_changes
from andrea.daemon.data.open_settings import read_run_config
from andrea.daemon.metrics.prometheus import exposition_for
from andrea.daemon.mixing.archive import archive_samples, phase_starts
from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit
from andrea.daemon.mixing.peers import TrainerLife, TrainerPeers
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.policystore import store
from andrea.daemon.mixing.proxyfiles import (
    ProxyState,
    SampleRecord,
    SamplesFile,
    empty_samples,
    load_samples,
    now_utc,
    write_state_file,
)
from andrea.daemon.mixing.startup import (
    check_log_against_checkpoints,
    configured_arms,
    replay,
    restore_bandit,
)
from andrea.daemon.rundir.evallog import EvalLog, last_eval
from andrea.daemon.rundir.layout import (
    EVAL_FILE,
    LOSS_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    TENSORBOARD_DIR,
    recorded_config,
)
from andrea.daemon.rundir.losslog import LossLog, canonical_curve, read_entries
from andrea.protocol import messages
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.status import ProxyStatus

log = logging.getLogger(__name__)

STATE_EVERY = 100


@dataclass
class ProxyOptions:
    run_dir: Path
    cfg: RunConfig
    policy: Policy
    #: Text to make the run's policy file before starting (a first start, or `--policy --pivot`).
    policy_text: str | None = None
    #: The config file given (--config), re-read after a deliberate config change
    #: (--allow-config-change); without one, the run's recorded config (`recorded_config`).
    config_path: Path | None = None


class ProxyRunState:
    """The run as the proxy knows it. `start` reads it from the run directory; the handlers read
    the attributes and change them through the methods below."""

    def __init__(self, opts: ProxyOptions) -> None:
        self.opts = opts
        self.run_dir = opts.run_dir

    # ---- start ------------------------------------------------------------------------------

    def start(self) -> int:
        """Open the run's files and rebuild the state from them; returns how many entries
        `.loss.json` holds. `policy_changed` then says whether a manual pivot is due."""
        self.policy_changed = False
        self.configured = configured_arms(self.opts.cfg, self.run_dir)
        if self.opts.policy_text is not None:
            self.check_policy(self.opts.policy)
            store(self.run_dir, self.opts.policy_text)
        self.losslog = LossLog.open(self.run_dir / LOSS_FILE)
        self.evallog = EvalLog.open(self.run_dir / EVAL_FILE)
        self.last_eval = last_eval(self.run_dir / EVAL_FILE)
        entries = read_entries(self.run_dir / LOSS_FILE)
        check_log_against_checkpoints(self.run_dir, {e.step for e in entries})
        bandit, max_segment, trainer = self._restore_bandit(entries)
        self.peers = TrainerPeers(self.run_dir, trainer)
        self.book = AssignmentBook(bandit, self.configured, starts=phase_starts(self.run_dir))
        progress = replay(self.book, entries, max_segment)
        self.durable_step = progress.durable_step
        self.max_segment = progress.max_segment
        self.trainer_step = progress.trainer_step
        self.samples = self._load_samples()
        self.steps_since_state = 0
        self.mix_since_sample: dict[str, int] = {}
        self.board = None
        if self.opts.cfg.metrics.tensorboard:
            from andrea.daemon.metrics.tensorboard import LiveBoard

            self.board = LiveBoard(self.run_dir / TENSORBOARD_DIR, canonical_curve(entries))
        self.prometheus = exposition_for(self.opts.cfg.metrics, "proxy", self.run_dir)
        return len(entries)

    def _restore_bandit(self, entries: list[LossEntry]) -> tuple[Bandit, int, TrainerLife | None]:
        """The bandit, the highest segment number and the live trainer life, from `.state.json`
        (checked against a replay of `entries`, the log) or a replay of the log."""
        restored = restore_bandit(
            self.run_dir, self.configured, self.opts.cfg.seed, self.opts.policy, entries
        )
        self.policy_changed = restored.policy_changed
        return restored.bandit, restored.max_segment, restored.trainer

    def _load_samples(self) -> SamplesFile:
        return load_samples(self.run_dir)

    # ---- config -----------------------------------------------------------------------------

    def check_policy(self, policy: Policy) -> None:
        """A new policy must name only this run's arms and be feasible over the live ones."""
        policy.check_arms(c.name for c in self.configured)
        policy.check_feasible(c.name for c in self.configured if c.available)

    def reload_config(self) -> None:
        """The trainer may have recorded a deliberate change (--allow-config-change)
        since this proxy read it: take a changed seed or arm set from there. The running phase's
        bandit keeps its own seed (its draws so far are in .state.json); a removed arm becomes a
        zombie, an added one joins with a fresh reward."""
        path = self.opts.config_path or recorded_config(self.run_dir)
        if path is None:
            return
        try:
            cfg = read_run_config(path, self.run_dir)
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

    # ---- records ----------------------------------------------------------------------------

    def new_segment(self, peer: bytes, hello: messages.Hello) -> int:
        """Number a new segment for the life `hello` admitted (`peers.refusal` said None), which
        resumes after `hello.resume_step`, and make it the live one."""
        self.max_segment += 1
        self.peers.admit(peer, hello, self.max_segment)
        self.write_state()  # the number and the live life are durable before they are given out
        self.trainer_step = hello.resume_step
        return self.max_segment

    def known_segment(self, peer: bytes, hello: messages.Hello, segment: int) -> None:
        """The admitted life `hello` back with its number: one past the highest known is the most
        a lost or older `.state.json` can hide, and it is made durable again."""
        grew = segment > self.max_segment
        self.max_segment = max(self.max_segment, segment)
        if self.peers.admit(peer, hello, segment) or grew:
            self.write_state()

    def append_losses(self, entries: list[LossEntry]) -> None:
        """Log checked loss records durably, then count them (a superseded one is logged only)."""
        written = self.losslog.append_many(entries)
        self.losslog.sync()  # acknowledged means durable
        for e in entries:
            if self.book.record(e.step, e.arm, e.loss, e.phase, e.heldout, e.probe):
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
            self.write_state()
        if self.board is not None:
            self.board.log(entries, self.book.bandit.probabilities(), self.book.bandit.rewards())
        self.publish_metrics()

    def append_eval(self, e: EvalEntry) -> None:
        """Log a held-out evaluation durably (a re-sent one is already there)."""
        if self.evallog.append(e):
            self.evallog.sync()  # acknowledged means durable
            self.last_eval = e
            if self.board is not None:
                self.board.log_eval(e)
            name, worst = e.worst()
            log.info(
                "held-out loss at step %d (segment %d): mean %.4f, worst %s %.4f",
                e.step,
                e.segment,
                e.mean_loss(),
                name,
                worst,
            )

    def keep_samples(self, msg: messages.SampleReport) -> None:
        """Keep the samples of a step of the phase that owns it: the current phase's with the arm
        mix that led to them, an ended phase's (re-sent late) in its archive. Samples are an
        audit: a file that cannot be written is logged, and the run goes on (a full disk stops
        the proxy at the next loss record, which is not an audit)."""
        try:
            if msg.phase != self.book.bandit.phase:
                archive_samples(self.run_dir, msg)
                return
            if self.samples.holds(msg.step, msg.segment):
                return
            rec = SampleRecord.received(msg, arm_mix=dict(sorted(self.mix_since_sample.items())))
            self.mix_since_sample = {}
            self.samples.keep(rec)
            self.samples.write(self.run_dir / SAMPLES_FILE)
        except OSError as e:
            log.warning(
                "the samples of step %d could not be written (%s); kept no further", msg.step, e
            )

    def start_phase(self, bandit: Bandit, policy: Policy) -> None:
        """The commit of a pivot (its archive is written): `bandit` runs the steps after its
        phase's start under `policy`, with no samples kept yet."""
        self.book = self.book.next_phase(bandit)
        self.opts.policy = policy
        self.write_state()  # the commit point of the pivot
        self.publish_metrics(force=True)
        self.samples = empty_samples()
        self.samples.write(self.run_dir / SAMPLES_FILE)
        self.mix_since_sample = {}

    def supersede_after(self, boundary: int) -> None:
        """A manual pivot's boundary: the steps the trainer trained past it under the old policy
        stay in the log but no longer count as durable progress."""
        self.durable_step = min(self.durable_step, boundary)

    def write_state(self) -> None:
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
            trainer=self.peers.live,
        )
        write_state_file(self.run_dir, state)
        self.steps_since_state = 0

    # ---- views ------------------------------------------------------------------------------

    def publish_metrics(self, force: bool = False) -> None:
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

    def status(self) -> ProxyStatus:
        b = self.book.bandit
        return ProxyStatus(
            durable_step=self.durable_step,
            max_segment=self.max_segment,
            phase=b.phase,
            phase_start_step=b.phase_start_step,
            lag=self.book.lag,
            probabilities=b.probabilities(),
            zombies=b.zombies,
            policy_fingerprint=b.policy.fingerprint(),
            trainer_step=self.trainer_step,
            last_eval=self.last_eval,
            reward=b.reward_report(),
        )

    def close_files(self) -> None:
        """Close the files, with a last `.state.json` (a failure to write it is logged: the
        previous one stays, and a restart replays `.loss.json`)."""
        if self.board is not None:
            self.board.close()
        self.publish_metrics(force=True)
        try:
            self.write_state()
        except OSError as e:
            log.error("could not write %s on exit: %s", STATE_FILE, e)
        self.losslog.close()
        self.evallog.close()
