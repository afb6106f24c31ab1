"""How the proxy finds its place in a run directory when it starts: which arms are available, whether
`.loss.json` agrees with the checkpoints, the bandit (from `.state.json`, or rebuilt by replaying
the log), the progress the log shows, and where a manual pivot would start.

Nothing here serves a request; `run_state.ProxyRunState.start` puts the pieces together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from andrea.daemon.checkpoint.manager import checkpoint_steps, read_manifest, verify_checkpoint
from andrea.daemon.config import RunConfig
from andrea.daemon.data.arms import DataError, arm_identity
from andrea.daemon.mixing import rewards
from andrea.daemon.mixing.archive import last_pivot, phase_starts
from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit, BanditError, BanditState, ConfiguredArm
from andrea.daemon.mixing.peers import TrainerLife
from andrea.daemon.mixing.policy import Policy, PolicyError
from andrea.daemon.mixing.proxyfiles import check_state, move_aside, parse_state_file
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.layout import LOSS_FILE, POLICY_FILE, STATE_FILE
from andrea.protocol.lossentry import LossEntry

log = logging.getLogger(__name__)


class LogContradiction(ValueError):
    """.loss.json contradicts the checkpoints: a person must restore it (exit 4)."""


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


def _ranges(steps: list[int]) -> str:
    out: list[str] = []
    start = steps[0]
    for a, b in zip(steps, [*steps[1:], None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            if b is not None:
                start = b
    return ", ".join(out[:5]) + (", ..." if len(out) > 5 else "")


def check_log_against_checkpoints(run_dir: Path, logged: set[int]) -> None:
    """Refuse a .loss.json that lacks steps the trainer's newest checkpoint says were trained
    (a truncated or replaced log): the trainer would resume there and wait forever for
    assignments that need those losses. A checkpoint may legitimately be ahead of the log
    by the records the proxy had not acknowledged; those travel in its manifest."""
    for step in checkpoint_steps(run_dir):
        try:
            # Only mixing fields are read: the RNG states are checked without torch's trial.
            manifest = read_manifest(run_dir, step, rng_trial=False)
        except (ValueError, OSError):
            continue  # damaged: the trainer skips it too
        if manifest.mixing.mode != "proxy":
            return
        pending = {e.step for e in manifest.pending_losses}
        first = last_pivot(run_dir)[1] + 1  # earlier phases' steps are not replayed
        missing = [s for s in range(first, step + 1) if s not in logged and s not in pending]
        if missing:
            raise LogContradiction(
                f"{LOSS_FILE} lacks the losses of {len(missing)} steps ({_ranges(missing)}) that"
                f" checkpoint {rundir.bin_name(step)} says were trained and acknowledged: the log"
                " was truncated or replaced. Restore it from a backup; the proxy will not run on"
                " a log that contradicts the checkpoints"
            )
        return


@dataclass(frozen=True)
class Restored:
    bandit: Bandit
    #: The highest segment `.state.json` numbered (0 without one).
    max_segment: int
    #: The run's policy file differs from the restored bandit's policy: a manual pivot.
    policy_changed: bool
    #: The trainer life `.state.json` says the proxy serves (None without one).
    trainer: TrainerLife | None = None


def restore_bandit(
    run_dir: Path,
    configured: list[ConfiguredArm],
    seed: int,
    policy: Policy,
    entries: list[LossEntry],
) -> Restored:
    """The bandit from .state.json, or a fresh one that replays .loss.json (`entries`).

    The fresh bandit is not a reset: assignments are a pure function of the logged losses, so
    replaying them from the phase start rebuilds exactly the bandit the state file held. That
    is also the documented recovery from a damaged state file (moved aside, never deleted), and
    how the state file is checked: a snapshot the replay does not arrive at was edited.
    """
    path = run_dir / STATE_FILE
    if path.exists():
        try:
            state = parse_state_file(path)
            check_state(state, seed, max((e.step for e in entries), default=0))
            starts = phase_starts(run_dir)
            check_phase(state.bandit, starts)
            check_against_log(state.bandit, entries, starts)
            bandit = Bandit.from_state(state.bandit, configured)
        except (ValueError, BanditError, PolicyError) as e:
            bad = move_aside(path)
            log.warning("%s; moved to %s and rebuilding the bandit from .loss.json", e, bad.name)
        else:
            log.info(
                "bandit restored from %s at step %d (phase %d)",
                path.name,
                bandit.last_step,
                bandit.phase,
            )
            changed = state.bandit.policy_fingerprint != policy.fingerprint()
            return Restored(bandit, state.max_segment, changed, state.trainer)
    phase, start = last_pivot(run_dir)
    # Arms the phase trained on that the run no longer configures (removed by a deliberate config
    # change): without them the replay would refuse their logged steps and the run would stop.
    departed = {e.arm for e in entries if e.step > start and e.phase == phase}
    bandit = Bandit(
        configured, policy, seed=seed, phase=phase, start_step=start, departed=sorted(departed)
    )
    log.info(
        "bandit for phase %d (after step %d) over arms %s; logged losses are replayed as needed",
        phase,
        start,
        ", ".join(bandit.live_arms),
    )
    return Restored(bandit, 0, False)


def check_phase(state: BanditState, starts: dict[int, int]) -> None:
    """The state's phase must be one the run has: phase 0 from step 0, or a phase a pivot record
    under archive/ starts at the state's `phase_start_step`."""
    known = {0: 0, **starts}
    if known.get(state.phase) != state.phase_start_step:
        have = ", ".join(f"phase {p} after step {s}" for p, s in sorted(known.items()))
        raise ValueError(
            f"{STATE_FILE}: bandit phase {state.phase} starting after step"
            f" {state.phase_start_step} is not a phase of this run ({have})"
        )


#: The fields of an arm's history in a snapshot, which only its observed losses decide (its
#: weight, probability and zombie status are recomputed from them and the arms configured now);
#: the reward's own `replayed` statistics are compared too.
_HISTORY = ("identity", "pulls", *rewards.HISTORY)


def check_against_log(state: BanditState, entries: list[LossEntry], starts: dict[int, int]) -> None:
    """Replay the logged losses of the state's phase up to its `last_step` with a fresh bandit and
    compare: every number the snapshot holds follows from the log, so any difference means the
    state file was edited or damaged. Raises ValueError naming the first difference."""
    arms = [ConfiguredArm(a.name, a.identity, a.live) for a in state.arms]
    fresh = Bandit(
        arms, state.policy, seed=state.seed, phase=state.phase, start_step=state.phase_start_step
    )
    book = AssignmentBook(fresh, arms, starts=starts)
    for e in entries:
        book.record(e.step, e.arm, e.loss, e.phase, e.heldout, e.probe)
    if not book.incorporate(state.last_step):
        raise ValueError(
            f"{STATE_FILE}: its bandit has seen step {state.last_step}, but {LOSS_FILE} lacks"
            f" the loss of step {book.bandit.last_step + 1}"
        )
    replayed = book.bandit.state_dict()
    if replayed.last_observation != state.last_observation:
        raise ValueError(
            f"{STATE_FILE}: last_observation {state.last_observation} is not the log's"
            f" ({replayed.last_observation})"
        )
    if replayed.transfer != state.transfer:
        raise ValueError(
            f"{STATE_FILE}: its transfer statistics are not what replaying {LOSS_FILE} to step"
            f" {state.last_step} gives"
        )
    logged_arms = {a.name: a for a in replayed.arms}
    compared = _HISTORY + rewards.lookup(state.policy.reward).replayed
    for mine in state.arms:
        logged = logged_arms[mine.name]
        for field in compared:
            if getattr(mine, field) != getattr(logged, field):
                raise ValueError(
                    f"{STATE_FILE}: arm {mine.name!r} has {field} = {getattr(mine, field)!r},"
                    f" but replaying {LOSS_FILE} to step {state.last_step} gives"
                    f" {getattr(logged, field)!r}"
                )


@dataclass(frozen=True)
class Progress:
    """How far the run got, as the log shows."""

    durable_step: int  # every counted loss up to here is logged
    max_segment: int
    trainer_step: int  # the newest trainer life's progress


def replay(book: AssignmentBook, entries: list[LossEntry], max_segment: int) -> Progress:
    """Record every logged loss in `book`; entries a pivot superseded are kept in the log but
    counted by nothing."""
    durable_step = trainer_step = superseded = 0
    for e in entries:
        if book.record(e.step, e.arm, e.loss, e.phase, e.heldout, e.probe):
            durable_step = max(durable_step, e.step)
        else:
            superseded += 1
        if e.segment > max_segment:
            max_segment, trainer_step = e.segment, e.step
        elif e.segment == max_segment:
            trainer_step = max(trainer_step, e.step)
    if superseded:
        log.info("%d logged entries are superseded by pivots (kept, not counted)", superseded)
    return Progress(durable_step, max_segment, trainer_step)


def manual_pivot_boundary(run_dir: Path, book: AssignmentBook) -> int:
    """The boundary of a manual pivot: the trainer's newest intact checkpoint, where `andreactl
    pivot` would have held it. Raises PolicyError when no checkpoint of the current phase is
    intact."""
    for step in checkpoint_steps(run_dir):
        if step < book.phase_start:
            break
        try:
            verify_checkpoint(run_dir, step)
        except ValueError as e:
            log.warning("checkpoint %d cannot be a pivot point: %s", step, e)
            continue
        return step
    raise PolicyError(
        f"{POLICY_FILE} differs from the policy of phase {book.bandit.phase} (a pivot), "
        f"but no intact checkpoint at or after the phase's start (step {book.phase_start}) "
        "can be its boundary; let the trainer write one (SIGUSR1) and start the proxy again"
    )
