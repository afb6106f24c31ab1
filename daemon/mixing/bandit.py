"""Online data mixing: an EXP3-style bandit over data sources ("arms"), with caps, floors and a lag.

With K live arms and t the number of losses incorporated in the current phase, the policy's reward
(a module of `andrea.daemon.mixing.rewards`, found by name: docs/bandit.md lists them) turns the
arms' loss statistics into mixture weights w, with EXP3's exploration
``eps_t = min(1/K, sqrt(ln K / (K t)))`` mixed in, and for t = 0 the policy's normalised initial
weights. Then

- probabilities: ``p = clip(c * w, floor, cap)`` with the unique c that makes ``sum(p) = 1`` — the
  KL projection of w onto the capped simplex, solved exactly from the breakpoints of c.

Determinism: the arm of step s is a pure function of (seed, phase, policy, live arms, loss records
of the phase's steps <= s - W): each record's arm and loss, and the held-out evaluation the record
of the step after each evaluation carries (gated-plateau, gated-fall and gated-heldout read them).
Records are incorporated strictly in step order, `assign` refuses to run at any other point than
"everything up to s - W, nothing after", and the draw itself is a counter-based uniform (SHA-256 of
seed, phase and step), so a restarted proxy recomputes every assignment bit for bit. Under a reward
whose draw counts the steps pending (`RewardKind.counts_pending`: gated-learnability-2,
gated-heldout, gated-fall, gated-plateau) the draw of s also depends on the arms assigned to the
steps between s - W and s, which are functions of the same records; `assign` takes them from the
caller (the assignment book).

Zombies: `Bandit.from_state` reconciles the arms of a saved state with the configured sources. An arm
whose source is gone never draws (p = 0, its floor not counted), stays in the state with its history,
and is reported (`Bandit.zombies` and a logging warning).

Pure: no I/O, no clock, no global random state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from andrea.daemon.config import ARM_NAME_PATTERN
from andrea.daemon.mixing import reward, rewards
from andrea.daemon.mixing.policy import IMPLICIT_REWARD, TARGETED_REWARDS, Policy
from andrea.daemon.mixing.reward import ArmStats
from andrea.daemon.mixing.rewards import transfer
from andrea.daemon.rundir.layout import STATE_FILE
from andrea.daemon.runtime.validation_messages import describe
from andrea.protocol.status import ArmReward, RewardReport, Zombie

log = logging.getLogger(__name__)

#: Version of the draw: bumping it changes every assignment, so it is part of the state's format.
_DRAW_DOMAIN = b"andrea.bandit.draw.v1"


class BanditError(RuntimeError):
    """Misuse of the bandit or an unusable arm set."""


class ObservationOrderError(BanditError):
    """A loss was offered out of step order (or for a step already incorporated, with other values)."""


class LagError(BanditError):
    """`assign(s)` was called when the incorporated losses are not exactly those of steps <= s - W."""


class BanditStateError(BanditError, ValueError):
    """A saved bandit state that cannot be used (malformed JSON, wrong types, inconsistent counters)."""


class ConfiguredArm(NamedTuple):
    """A data source as the proxy's configuration sees it now."""

    name: str
    identity: str
    available: bool


# --------------------------------------------------------------------------------------------------
# State (the `.state.json` contract)
# --------------------------------------------------------------------------------------------------


#: The loss reward's EMA of exp(loss), for losses clamped at MAX_EXP_LOSS (with room for the
#: EMA's rounding).
_MAX_REWARD = math.exp(reward.MAX_EXP_LOSS) * (1 + 1e-9)


#: A loss statistic in a state: losses are clamped to MAX_EXP_LOSS nats before any statistic sees them.
_LossValue = Annotated[float, Field(ge=-reward.MAX_EXP_LOSS, le=reward.MAX_EXP_LOSS)]
_Loss = _LossValue | None


class _StateModel(BaseModel):
    # strict: a state is written by this module; any coercion ("3" for 3) means it was edited or broken.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ArmState(_StateModel):
    """One arm in the saved state. Zombies keep their numbers as history."""

    name: str = Field(pattern=ARM_NAME_PATTERN)
    identity: str = Field(
        description="identity (listing hash) of the source this arm's history belongs to"
    )
    live: bool
    zombie_reason: str | None = None
    pulls: int = Field(ge=0, description="steps of the current phase trained on this arm")
    ema_reward: float = Field(
        ge=0.0, le=_MAX_REWARD, description="the loss reward's R_i, the EMA of exp(loss)"
    )
    weight: float = Field(ge=0.0, description="mixture weight w_i before the cap/floor projection")
    probability: float = Field(ge=0.0, le=1.0)
    # Version 2: the learnability reward's statistics (reward.py); absent from version 1 states.
    loss_ema: _Loss = Field(
        None, description="m_i, EMA of the arm's training loss; null before its first step"
    )
    loss_best: _Loss = Field(None, description="b_i, the lowest m_i of the phase")
    # The drops it sums add up to at most the span of the (clamped) loss EMA.
    progress_sum: float = Field(
        0.0,
        ge=0.0,
        le=2 * reward.MAX_EXP_LOSS,
        description="D_i, the age-weighted sum of new lows",
    )
    progress_pulls: float = Field(0.0, ge=0.0, description="P_i, the age-weighted count of steps")
    last_pull: int = Field(0, ge=0, description="the step of the arm's last loss (0: none yet)")
    # Absent from the states written before gated-learnability-2, whose rewards do not use it.
    fruitless: int = Field(
        0, ge=0, description="the arm's steps since its loss EMA last set a new low"
    )
    # Absent from the states written before gated-heldout, whose rewards do not use them.
    first_loss: _Loss = Field(None, description="the arm's first training loss of the phase")
    heldout: _Loss = Field(None, description="its held-out loss at the newest evaluation")
    heldout_low: _Loss = Field(None, description="its lowest held-out loss of the phase")
    heldout_evals: int = Field(0, ge=0, description="the evaluations of it seen in the phase")
    forgotten: bool = Field(
        False, description="its held-out loss rose at the newest evaluation, above its low"
    )
    # Absent from the states written before gated-fall, whose rewards do not use it.
    fall_rate: float = Field(
        0.0,
        ge=0.0,
        le=2 * reward.MAX_EXP_LOSS,
        description="its new lows' drops, an EMA over its own steps",
    )
    fall_pulls: int = Field(
        0, ge=0, description="its steps after its first, as fall_rate counts them"
    )
    # Absent from the states written before gated-plateau; the other rewards leave them empty.
    recent_losses: list[_LossValue] = Field(
        default_factory=list,
        max_length=reward.RECENT_KEPT,
        description="gated-plateau: its newest training losses of the phase, the newest last",
    )
    recent_steps: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        max_length=reward.RECENT_KEPT,
        description="gated-plateau: the steps of those losses",
    )
    first_step: int = Field(
        0, ge=0, description="gated-plateau: the step of its first loss of the phase (0: none)"
    )
    cut_level: _Loss = Field(
        None, description="gated-plateau: its loss level when called plateaued (null: not called)"
    )
    cut_step: int = Field(
        0, ge=0, description="gated-plateau: the step of its call or newest retest (0: none)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> ArmState:
        if self.live == (self.zombie_reason is not None):
            raise ValueError(
                f"arm {self.name!r}: a zombie_reason is required exactly when live is false"
            )
        if (self.loss_ema is None) != (self.loss_best is None):
            raise ValueError(f"arm {self.name!r}: loss_ema and loss_best come together")
        if (self.heldout is None) != (self.heldout_low is None):
            raise ValueError(f"arm {self.name!r}: heldout and heldout_low come together")
        _check_plateau_call(self)
        # Both count this arm's steps of the phase, at most one per pull.
        if self.fruitless > self.pulls or self.progress_pulls > self.pulls:
            raise ValueError(
                f"arm {self.name!r}: fruitless {self.fruitless} and progress_pulls"
                f" {self.progress_pulls} cannot exceed its pulls ({self.pulls})"
            )
        if self.loss_ema is not None and self.loss_best is not None:
            if self.loss_best > self.loss_ema:
                raise ValueError(
                    f"arm {self.name!r}: loss_best {self.loss_best} is above loss_ema "
                    f"{self.loss_ema} (it is their minimum)"
                )
        return self

    def stats(self) -> ArmStats:
        return ArmStats(**_statistics(self))


def _statistics(source: ArmStats | ArmState) -> dict[str, Any]:
    """Every `ArmStats` field of `source`, by name; the lists copied, so that statistics updated in
    place never share one with a state."""
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(ArmStats)}
    values.update(recent_losses=list(source.recent_losses), recent_steps=list(source.recent_steps))
    return values


def _check_plateau_call(arm: ArmState) -> None:
    """gated-plateau's statistics agree with one another: one step per loss, in step order, and
    a call made at a step of the arm's."""
    steps = arm.recent_steps
    if len(steps) != len(arm.recent_losses):
        raise ValueError(f"arm {arm.name!r}: recent_losses and recent_steps come together")
    if any(b <= a for a, b in zip(steps, steps[1:])) or (steps and steps[0] < arm.first_step):
        raise ValueError(f"arm {arm.name!r}: recent_steps must rise from first_step")
    if (arm.cut_level is None) != (arm.cut_step == 0):
        raise ValueError(f"arm {arm.name!r}: cut_level and cut_step come together")


class LastObservation(_StateModel):
    step: int = Field(ge=1)
    arm: str
    loss: float


class TransferState(_StateModel):
    """The transfer reward's statistics of the phase (transfer.py), every arm of the state."""

    arms: list[str]
    exposure: list[float]
    window: list[float]
    gram: list[list[float]]
    moment: list[float]
    last_probe: float | None = None
    intervals: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _square(self) -> TransferState:
        k = len(self.arms)
        if self.arms != sorted(set(self.arms)):
            raise ValueError(f"transfer.arms {self.arms} must be sorted and distinct")
        rows = (self.exposure, self.window, self.moment, *self.gram)
        if len(self.gram) != k or any(len(r) != k for r in rows):
            raise ValueError(
                f"transfer: every vector and the gram matrix must be over its {k} arms"
            )
        return self

    @classmethod
    def of(cls, stats: transfer.TransferStats) -> TransferState:
        return cls(**dataclasses.asdict(stats))

    def stats(self) -> transfer.TransferStats:
        return transfer.TransferStats(
            arms=list(self.arms),
            exposure=list(self.exposure),
            window=list(self.window),
            gram=[list(r) for r in self.gram],
            moment=list(self.moment),
            last_probe=self.last_probe,
            intervals=self.intervals,
        )


class BanditState(_StateModel):
    """Everything needed to continue a phase exactly; stored as `.state.json` (JSON, never pickle)."""

    #: 1: written before the reward could be chosen (the loss reward, no loss statistics);
    #: 2: with each arm's loss statistics.
    version: Literal[1, 2] = 2
    seed: int = Field(ge=0, lt=2**63)
    phase: int = Field(ge=0)
    phase_start_step: int = Field(
        ge=0, description="last step of the previous phase (0 for the first)"
    )
    last_step: int = Field(
        ge=0, description="last incorporated step (total steps seen by the bandit)"
    )
    steps_in_phase: int = Field(ge=0)
    policy: Policy
    policy_fingerprint: str
    arms: list[ArmState]
    last_observation: LastObservation | None = None
    # Only under the transfer reward (a policy with a target); absent from every other state.
    transfer: TransferState | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _consistent(self) -> BanditState:
        names = [a.name for a in self.arms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate arm names: {dup}")
        if self.last_step < self.phase_start_step:
            raise ValueError(
                f"last_step {self.last_step} is before phase_start_step {self.phase_start_step}"
            )
        if self.steps_in_phase != self.last_step - self.phase_start_step:
            raise ValueError(
                f"steps_in_phase {self.steps_in_phase} != last_step - phase_start_step "
                f"= {self.last_step - self.phase_start_step}"
            )
        pulls = sum(a.pulls for a in self.arms)
        if pulls != self.steps_in_phase:
            raise ValueError(
                f"the arms' pulls sum to {pulls}, but steps_in_phase is {self.steps_in_phase}"
            )
        if self.policy_fingerprint != self.policy.fingerprint():
            raise ValueError(
                f"policy_fingerprint {self.policy_fingerprint} does not match the policy "
                f"({self.policy.fingerprint()}): the state was edited or corrupted"
            )
        obs = self.last_observation
        if (obs is None) != (self.steps_in_phase == 0):
            raise ValueError(
                "last_observation must be present exactly when the phase has incorporated steps"
            )
        if obs is not None and (obs.step != self.last_step or obs.arm not in names):
            raise ValueError(
                f"last_observation {obs} does not match last_step {self.last_step} and the arms"
            )
        if self.version == 1 and self.policy.reward != IMPLICIT_REWARD:
            raise ValueError(
                f"a version 1 state has the {IMPLICIT_REWARD!r} reward, not {self.policy.reward!r}"
            )
        late = [a.name for a in self.arms if a.last_pull > self.last_step]
        if late:
            raise ValueError(
                f"arms {late}: last_pull {max(a.last_pull for a in self.arms)} is "
                f"after last_step {self.last_step}"
            )
        if (self.transfer is not None) != rewards.lookup(self.policy.reward).targeted:
            raise ValueError(
                "transfer statistics must be present exactly under a reward that serves a "
                f"target ({', '.join(TARGETED_REWARDS)})"
            )
        if self.transfer is not None and self.transfer.arms != sorted(names):
            raise ValueError(f"transfer.arms {self.transfer.arms} are not the state's arms")
        if rewards.lookup(self.policy.reward).reads_progress:
            # Its mixture is made of these statistics: each measured arm must carry them.
            unmeasured = [a.name for a in self.arms if (a.loss_ema is None) != (a.pulls == 0)]
            if unmeasured:
                raise ValueError(
                    f"arms {unmeasured}: loss_ema must be present exactly when pulls > 0 "
                    f"under the {self.policy.reward} reward"
                )
        return self


def parse_state(data: str | bytes, origin: str = STATE_FILE) -> BanditState:
    """Validate saved state JSON. Raises `BanditStateError` naming `origin` and each bad field."""
    try:
        return BanditState.model_validate_json(data)
    except ValidationError as e:
        raise BanditStateError(describe(e, f"unusable bandit state ({origin})")) from e


class PhaseCounters(_StateModel):
    phase: int
    phase_start_step: int
    steps_in_phase: int
    total_steps: int = Field(
        description="last incorporated step; steps count from 1 over the whole run"
    )
    pulls: dict[str, int]


# --------------------------------------------------------------------------------------------------
# The math (pure functions, float64)
# --------------------------------------------------------------------------------------------------


def project_capped_simplex(y: np.ndarray, floor: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """The KL projection of positive weights y onto {p : floor <= p <= cap, sum p = 1}.

    It has the form p_i = clip(c * y_i, floor_i, cap_i) — proportional clip-and-redistribute, whose
    fixed point it is. g(c) = sum_i clip(c y_i, floor_i, cap_i) is continuous, non-decreasing and
    piecewise linear with breakpoints floor_i/y_i and cap_i/y_i; between two consecutive breakpoints
    every arm is at its floor, at its cap or free, so c solves a linear equation exactly. Bounds then
    hold exactly (np.clip) and the sum is 1 up to a few ulps. Requires floor <= cap elementwise and
    sum(floor) <= 1 <= sum(cap) (within 1e-12).
    """
    y = np.asarray(y, dtype=np.float64)
    lo = np.asarray(floor, dtype=np.float64)
    hi = np.asarray(cap, dtype=np.float64)
    if not (y.shape == lo.shape == hi.shape and y.ndim == 1 and y.size >= 1):
        raise ValueError(
            f"project_capped_simplex: shapes differ or empty: {y.shape}, {lo.shape}, {hi.shape}"
        )
    if not np.all(y > 0) or not np.all(np.isfinite(y)):
        raise ValueError(f"project_capped_simplex needs finite positive weights, got {y.tolist()}")
    if np.any(lo > hi):
        raise ValueError("project_capped_simplex: a floor is above its cap")
    # The feasibility tolerance admits floors summing to 1 + 1e-12; then the floors are the answer.
    if math.fsum(lo) >= 1.0:
        return lo.copy()
    if math.fsum(hi) <= 1.0:
        return hi.copy()
    knots = np.unique(np.concatenate([lo / y, hi / y]))
    g = np.clip(knots[:, None] * y[None, :], lo, hi).sum(axis=1)
    # g(knots[0]) = sum(floor) < 1 < sum(cap) = g(knots[-1]), so 1 <= j <= len - 1.
    j = int(np.clip(np.searchsorted(g, 1.0), 1, knots.size - 1))
    left, right = knots[j - 1], knots[j]
    at_floor = lo / y >= right
    at_cap = hi / y <= left
    free = ~(at_floor | at_cap)
    free_mass = math.fsum(y[free])
    fixed = math.fsum(lo[at_floor]) + math.fsum(hi[at_cap])
    # Rounding in g can pick the interval next to the true one; the solution then sits on their
    # shared knot, and clamping c there (instead of trusting a division by a tiny free mass) keeps
    # every arm consistent with its classification.
    c = min(max((1.0 - fixed) / free_mass, left), right) if free_mass > 0 else right
    p = np.where(at_floor, lo, np.where(at_cap, hi, c * y))
    return np.clip(p, lo, hi)


def draw_uniform(seed: int, phase: int, step: int) -> float:
    """A uniform in [0, 1) that is a pure function of (seed, phase, step): SHA-256 of the three
    integers, top 53 bits. Counter-based, so recomputing a past step's draw needs no generator state."""
    digest = hashlib.sha256(b"%s:%d:%d:%d" % (_DRAW_DOMAIN, seed, phase, step)).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) * 2.0**-53


# --------------------------------------------------------------------------------------------------
# The bandit
# --------------------------------------------------------------------------------------------------


@dataclass
class _Arm:
    name: str
    identity: str
    zombie_reason: str | None
    pulls: int
    stats: ArmStats
    weight: float
    probability: float

    @property
    def live(self) -> bool:
        return self.zombie_reason is None


def _fresh(c: ConfiguredArm) -> _Arm:
    """An arm at the start of its phase: no steps, no statistics."""
    reason = None if c.available else "source not available"
    return _Arm(c.name, c.identity, reason, 0, ArmStats(), 0.0, 0.0)


def _departed(name: str) -> _Arm:
    """A zombie for an arm the phase trained on that is no longer configured. The log does not
    record a source's identity: an arm configured again under that name is a new source to this
    history (`Bandit.from_state`: "source identity changed")."""
    return _Arm(name, "", "source not configured", 0, ArmStats(), 0.0, 0.0)


def _index_configured(
    arms: Sequence[ConfiguredArm | tuple[str, str, bool]],
) -> dict[str, ConfiguredArm]:
    out: dict[str, ConfiguredArm] = {}
    for a in arms:
        c = ConfiguredArm(*a)
        if not re.fullmatch(ARM_NAME_PATTERN, c.name):
            raise BanditError(f"arm name {c.name!r} does not match {ARM_NAME_PATTERN}")
        if c.name in out:
            raise BanditError(f"arm {c.name!r} is configured twice")
        out[c.name] = c
    return out


def _target(
    policy: Policy,
    reward: rewards.RewardKind,
    arms: list[str],
    saved: transfer.TransferStats | None,
) -> transfer.Target | None:
    """The phase's target and its probes' statistics, under a reward that serves a target."""
    if not reward.targeted:
        return None
    return transfer.Target.of(policy.target_weights(), arms, saved, reward.target_floor)


def _observe(
    stats: ArmStats, kind: rewards.RewardKind, step: int, loss: float, alpha: float
) -> None:
    """Fold an arm's loss into the statistics every reward keeps, then into the reward's own."""
    reward.observe(stats, step, loss, alpha)
    if kind.observe is not None:
        kind.observe(stats, step, loss)


def _arm_state(a: _Arm) -> ArmState:
    """The arm as the state saves it: its identity, steps and weights, and every statistic."""
    return ArmState(
        name=a.name,
        identity=a.identity,
        live=a.live,
        zombie_reason=a.zombie_reason,
        pulls=a.pulls,
        weight=a.weight,
        probability=a.probability,
        **_statistics(a.stats),
    )


def _zombies(arms: Iterable[_Arm]) -> list[Zombie]:
    """The arms whose source is gone, for the operator's status; each one logged as a warning."""
    out = [
        Zombie(
            name=a.name,
            identity=a.identity,
            reason=a.zombie_reason,
            pulls=a.pulls,
            ema_reward=a.stats.ema_reward,
            weight=a.weight,
        )
        for a in arms
        if a.zombie_reason is not None
    ]
    for z in out:
        log.warning(
            "zombie arm %r: %s; it will never draw, and its history stays in the state "
            "(pulls=%d, ema_reward=%r, weight=%r)",
            z.name,
            z.reason,
            z.pulls,
            z.ema_reward,
            z.weight,
        )
    return out


class Bandit:
    """The mixing bandit of one phase.

    Drive it like this (the proxy does): before assigning step s, `observe` every step up to s - W in
    order with the arm it was trained on and its loss, then `assign(s)`. Exact duplicates of the last
    observation are ignored (at-least-once delivery); anything else out of order raises.
    """

    def __init__(
        self,
        arms: Sequence[ConfiguredArm | tuple[str, str, bool]],
        policy: Policy,
        *,
        seed: int,
        phase: int = 0,
        start_step: int = 0,
        departed: Sequence[str] = (),
    ) -> None:
        """A fresh bandit for a new phase whose first step is `start_step + 1`. Configured arms that
        are not available join as zombies (reported, never drawn); so do the `departed` arms, no
        longer configured but trained on in this phase (a bandit rebuilt from the log after an
        arm's removal: its logged steps replay into their history, as `from_state` keeps them)."""
        configured = _index_configured(arms)
        records = [_fresh(c) for c in configured.values()]
        records += [_departed(name) for name in sorted(set(departed) - set(configured))]
        self._setup(
            records,
            policy,
            seed=seed,
            phase=phase,
            start_step=start_step,
            last_step=start_step,
            last=None,
        )

    @classmethod
    def from_state(
        cls, state: BanditState, configured_arms: Sequence[ConfiguredArm | tuple[str, str, bool]]
    ) -> Bandit:
        """Continue a saved phase, reconciling its arms with the sources configured now.

        An arm of the state whose source is not configured, not available, or has another identity
        becomes a zombie: probability 0, never drawn, kept with its history, reported. Configured arms
        the state lacks join with a fresh reward. Probabilities are recomputed from the rewards, so
        an unchanged arm set continues bit for bit.
        """
        configured = _index_configured(configured_arms)
        records: list[_Arm] = []
        for a in state.arms:
            c = configured.get(a.name)
            if c is None:
                reason = "source not configured"
            elif not c.available:
                reason = "source not available"
            elif c.identity != a.identity:
                reason = (
                    f"source identity changed (state {a.identity}, configured {c.identity}); "
                    "a new source under this name needs a new phase (pivot)"
                )
            else:
                reason = None
                if not a.live:
                    log.info(
                        "arm %r: its source is back (identity %s); it draws again",
                        a.name,
                        a.identity,
                    )
            records.append(
                _Arm(a.name, a.identity, reason, a.pulls, a.stats(), a.weight, a.probability)
            )
        known = {a.name for a in state.arms}
        for c in configured.values():
            if c.name not in known:
                log.info("arm %r joins phase %d with a fresh reward", c.name, state.phase)
                records.append(_fresh(c))
        obj = cls.__new__(cls)
        obj._setup(
            records,
            state.policy,
            seed=state.seed,
            phase=state.phase,
            start_step=state.phase_start_step,
            last_step=state.last_step,
            last=state.last_observation,
            transfer_stats=state.transfer.stats() if state.transfer is not None else None,
        )
        return obj

    def _setup(
        self,
        records: list[_Arm],
        policy: Policy,
        *,
        seed: int,
        phase: int,
        start_step: int,
        last_step: int,
        last: LastObservation | None,
        transfer_stats: transfer.TransferStats | None = None,
    ) -> None:
        if not 0 <= seed < 2**63 or phase < 0 or start_step < 0 or last_step < start_step:
            raise BanditError(
                f"bad counters: seed={seed} phase={phase} start_step={start_step} last_step={last_step}"
            )
        self._policy = policy
        self._reward = rewards.lookup(policy.reward)
        self._seed = seed
        self._phase = phase
        self._start = start_step
        self._last_step = last_step
        self._last = last
        # Sorted by name: the draw walks the arms in this order, so configuration order cannot matter.
        self._arms = {a.name: a for a in sorted(records, key=lambda a: a.name)}
        self._target = _target(policy, self._reward, list(self._arms), transfer_stats)
        live = [a.name for a in self._arms.values() if a.live]
        policy.check_feasible(live)
        unknown = sorted(set(policy.arms) - set(live))
        if unknown:
            log.warning(
                "policy bounds for arms that are not live are ignored: %s", ", ".join(unknown)
            )
        self._zombies = _zombies(self._arms.values())
        self._refresh()

    def _refresh(self) -> None:
        """Recompute weights and probabilities from the rewards and t (nothing else)."""
        live = [a for a in self._arms.values() if a.live]
        w, p = self._mixture(live, [0] * len(live))
        for a, wi, pi in zip(live, w.tolist(), p.tolist()):
            a.weight, a.probability = wi, pi
        for a in self._arms.values():
            if not a.live:
                a.probability = 0.0

    def _mixture(self, live: list[_Arm], pending: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The weights and the probabilities of the live arms, given each one's pending steps."""
        lo, hi = self._policy.bounds([a.name for a in live])
        if self._target is not None:
            w = self._target.mixture([a.name for a in live], self.steps_in_phase)
            return w, project_capped_simplex(w, lo, hi)
        w = self._reward.weights(
            [a.stats for a in live],
            [a.pulls for a in live],
            pending,
            self.steps_in_phase,
            [self._policy.initial_weight(a.name) for a in live],
        )
        return w, project_capped_simplex(w, lo, hi)

    # ---------------------------------------------------------------------------------------------

    def observe(
        self,
        step: int,
        arm: str,
        loss: float,
        heldout: Mapping[str, float] | None = None,
        probe: Mapping[str, float] | None = None,
    ) -> bool:
        """Incorporate the loss of `step`, trained on `arm`, the held-out losses its record
        carries (those of the weights the step started from; arms the bandit does not know are
        ignored) and the target's probe losses (those of the weights after it; read under the
        transfer reward only). Steps must come as phase_start_step + 1, + 2, ... Returns False (and changes
        nothing) for an exact repeat of the last observation; raises `ObservationOrderError` for
        any other step than the next one. A zombie arm's loss (a step trained before its source
        went away) updates its history only."""
        loss = float(loss)
        if not math.isfinite(loss):
            raise ValueError(f"step {step}: loss {loss} is not finite")
        rec = self._arms.get(arm)
        if rec is None:
            raise BanditError(f"step {step}: unknown arm {arm!r} (arms: {', '.join(self._arms)})")
        last = self._last
        if last is not None and step == last.step:
            if arm == last.arm and loss == last.loss:
                return False
            raise ObservationOrderError(
                f"step {step} was already incorporated with arm {last.arm!r}, loss {last.loss!r}; "
                f"now offered with arm {arm!r}, loss {loss!r}"
            )
        if step != self._last_step + 1:
            raise ObservationOrderError(
                f"losses are incorporated in step order: expected step {self._last_step + 1}, got {step}"
            )
        # The evaluation came before the step's training: it closes the interval of the steps
        # before it.
        for name, value in (heldout or {}).items():
            if name in self._arms:
                reward.observe_heldout(self._arms[name].stats, float(value))
        _observe(rec.stats, self._reward, step, loss, self._policy.alpha)
        if self._target is not None:
            self._target.observe(arm, probe)
        rec.pulls += 1
        self._last_step = step
        self._last = LastObservation(step=step, arm=arm, loss=loss)
        self._refresh()
        return True

    def draw(self, step: int) -> str:
        """The arm that the current probabilities and the uniform of (seed, phase, step) select.
        Pure: the same call gives the same arm however often, in whatever order, it is made.
        Use `assign` to get the arm *for* a step; `draw` does not check the lag."""
        return self._pick(step, {a.name: a.probability for a in self._arms.values()})

    def _pick(self, step: int, probabilities: dict[str, float]) -> str:
        if step <= self._start:
            raise BanditError(
                f"step {step} belongs to an earlier phase (this one starts after step {self._start})"
            )
        u = draw_uniform(self._seed, self._phase, step)
        acc = 0.0
        chosen = None
        for name, p in probabilities.items():
            if p > 0.0:
                acc += p
                chosen = name
                if u < acc:
                    return name
        # The running sum can end an ulp below 1 while u lies in that ulp: the last drawable arm.
        assert chosen is not None  # check_feasible guarantees one live arm with p > 0
        return chosen

    def assign(self, step: int, pending: Sequence[str] | None = None) -> str:
        """The arm for `step`, using exactly the losses of steps <= step - W of this phase. Raises
        `LagError` if the bandit has incorporated fewer or more steps than that. `pending`: the
        arms assigned to the steps between the last incorporated one and `step`, in order; the
        gated-learnability-2 reward needs them (an arm whose measurement is under way draws no
        more steps for it), the others ignore them."""
        need = max(self._start, step - self._policy.lag)
        if self._last_step < need:
            raise LagError(
                f"assign(step={step}) needs the losses of steps up to {need} (lag W={self._policy.lag}); "
                f"only steps up to {self._last_step} are incorporated"
            )
        if self._last_step > need:
            raise LagError(
                f"assign(step={step}) may only use losses of steps up to {need} (lag W={self._policy.lag}), "
                f"but step {self._last_step} is already incorporated; re-serve the logged assignment instead"
            )
        if not self.counts_pending:
            return self.draw(step)
        if pending is None or len(pending) != step - 1 - self._last_step:
            raise BanditError(
                f"assign(step={step}) under the {self._policy.reward} reward needs the arms of "
                f"steps {self._last_step + 1} to {step - 1}, got {pending!r}"
            )
        return self._pick(step, self.probabilities(pending))

    # ---------------------------------------------------------------------------------------------

    def probabilities(self, pending: Sequence[str] = ()) -> dict[str, float]:
        """Current sampling probability per arm (sorted by name; zombies 0). Sums to 1 within 1e-12.
        `pending`: arms assigned to steps whose losses are not incorporated yet; under the
        gated-learnability-2 reward they change the probabilities until every arm is measured."""
        live = [a for a in self._arms.values() if a.live]
        if (
            not pending
            or not self.counts_pending
            or all(a.pulls >= reward.MEASURE_PULLS for a in live)
        ):
            return {a.name: a.probability for a in self._arms.values()}
        _, p = self._mixture(live, [pending.count(a.name) for a in live])
        out = dict.fromkeys(self._arms, 0.0)
        out.update(zip((a.name for a in live), p.tolist()))
        return out

    def rewards(self) -> dict[str, float]:
        """Each arm's current reward under the policy's reward (`RewardKind.shares`): the loss
        reward's R_i, or the share the learnability rewards give it (zombies: 0)."""
        if self._target is not None:
            return self._target.rewards(list(self._arms), self.live_arms)
        if not self._reward.reads_progress:
            # A statistic of each arm's own steps (the loss reward's R_i): zombies keep theirs.
            every = list(self._arms.values())
            own = self._reward.shares([a.stats for a in every], [a.pulls for a in every])
            return dict(zip((a.name for a in every), own))
        live = [a for a in self._arms.values() if a.live]
        shares = self._reward.shares([a.stats for a in live], [a.pulls for a in live])
        out = dict.fromkeys(self._arms, 0.0)
        out.update(zip((a.name for a in live), shares))
        return out

    def reward_report(self) -> RewardReport:
        """Per arm: the reward, the recent training loss and the progress, for people."""
        rewards = self.rewards()
        return RewardReport(
            kind=self._policy.reward,
            meaning=self._reward.meaning,
            arms={
                a.name: ArmReward(
                    reward=rewards[a.name],
                    loss=a.stats.loss_ema,
                    progress=a.stats.progress,
                    pulls=a.pulls,
                )
                for a in self._arms.values()
            },
        )

    def weights(self) -> dict[str, float]:
        """Mixture weights before the cap/floor projection (zombies: last value, as history)."""
        return {a.name: a.weight for a in self._arms.values()}

    def probe_arms(self, step: int) -> list[str] | None:
        """The target arms whose probe the record of `step` must carry (sorted), or None: under
        the transfer reward, every PROBE_EVERY steps of the phase."""
        return self._target.probe_arms(step, self._start, self.live_arms) if self._target else None

    @property
    def counts_pending(self) -> bool:
        """Whether `assign` needs the arms of the steps between the last incorporated one and
        the step assigned (`RewardKind.counts_pending`)."""
        return self._reward.counts_pending

    @property
    def zombies(self) -> list[Zombie]:
        return list(self._zombies)

    @property
    def live_arms(self) -> list[str]:
        return [a.name for a in self._arms.values() if a.live]

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def phase(self) -> int:
        return self._phase

    @property
    def phase_start_step(self) -> int:
        return self._start

    @property
    def last_step(self) -> int:
        """Last incorporated step (phase_start_step when none of this phase is)."""
        return self._last_step

    @property
    def steps_in_phase(self) -> int:
        return self._last_step - self._start

    def counters(self) -> PhaseCounters:
        return PhaseCounters(
            phase=self._phase,
            phase_start_step=self._start,
            steps_in_phase=self.steps_in_phase,
            total_steps=self._last_step,
            pulls={a.name: a.pulls for a in self._arms.values()},
        )

    def state_dict(self) -> BanditState:
        """Everything `from_state` needs to continue exactly, zombies included."""
        return BanditState(
            seed=self._seed,
            phase=self._phase,
            phase_start_step=self._start,
            last_step=self._last_step,
            steps_in_phase=self.steps_in_phase,
            policy=self._policy,
            policy_fingerprint=self._policy.fingerprint(),
            arms=[_arm_state(a) for a in self._arms.values()],
            last_observation=self._last,
            transfer=TransferState.of(self._target.stats) if self._target is not None else None,
        )
