"""The data-mixing policy: the reward, per-arm floors and caps, the reward smoothing and the lag.

A policy is one phase's rules for the bandit (`andrea.daemon.mixing.bandit`). It is read from TOML, validated
by pydantic (an unknown key is an error that names the key) and identified by a fingerprint that is
recorded in the bandit state and in every pivot archive. Example ``policy.toml``::

    reward = "gated-plateau"  # what the bandit rewards (docs/bandit.md lists the rewards)
    alpha = 0.9   # EMA smoothing of the per-arm reward (ODM's default)
    lag = 8       # W: the assignment of step s sees the losses of steps <= s - W

    [arms.code]
    floor = 0.20  # always at least 20% of the steps

    [arms.docstrings]
    cap = 0.50    # never more than half of the steps

    [arms.comments]
    floor = 0.05
    cap = 0.30

    [initial_weights]   # relative; arms not listed weigh 1
    code = 2.0

Arms the policy does not list get floor 0 and cap 1. Bounds of arms that are not live (zombies,
unconfigured sources) are ignored; feasibility over the live arms is checked by
`Policy.check_feasible` when a bandit is built.

With a target (the arms whose held-out loss the run is for; weights relative, 1 when left out),
the reward is "transfer-2" (or "transfer", named, as runs created before it have it): each arm's
measured effect on the target's held-out loss (`andrea.daemon.mixing.rewards.transfer`)::

    target = ["code", "comments=0.5"]   # or, as a table: [target] code = 1.0, comments = 0.5

A policy that does not name its reward means "loss": every policy written before the choice existed
did, and its fingerprint is unchanged. A new run's policy names it (`policystore`: a new run gets
`NEW_RUN_REWARD` unless its policy says otherwise).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from andrea.daemon.config import ARM_NAME_PATTERN
from andrea.daemon.mixing import rewards

# The run config's rule, so that every configured arm can be named here.
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded
from andrea.daemon.rundir.layout import POLICY_FILE
from andrea.daemon.runtime.validation_messages import describe

MIN_INITIAL_WEIGHT = 1e-9
MAX_INITIAL_WEIGHT = 1e9

#: A reward's name: one of `andrea.daemon.mixing.rewards`' registry (`rewards.names()`).
Reward = str
#: The rewards there are (each module of `andrea.daemon.mixing.rewards` registers one).
REWARDS: tuple[str, ...] = rewards.names()
#: The rewards whose mixture is made of each arm's progress statistics (reward.py).
LEARNABILITY_REWARDS: tuple[str, ...] = tuple(
    n for n in REWARDS if rewards.lookup(n).reads_progress and not rewards.lookup(n).targeted
)
#: The rewards that serve a `target`: each arm's measured effect on the target's held-out loss.
TARGETED_REWARDS: tuple[str, ...] = tuple(n for n in REWARDS if rewards.lookup(n).targeted)
#: The reward a policy with a `target` gets when it names none (and a pivot to a target).
TARGET_REWARD: Reward = "transfer-2"
#: A target weight's bounds (weights are relative, as initial weights are).
MIN_TARGET_WEIGHT = 1e-6
MAX_TARGET_WEIGHT = 1e6
#: What a policy without a `reward` key means: ODM's reward, the only one before the choice existed.
IMPLICIT_REWARD: Reward = "loss"
#: The reward a new run gets when its policy does not name one (decided in `policystore`).
NEW_RUN_REWARD: Reward = "gated-plateau"

#: Slack for comparing sums of probabilities written in decimal (ten floors of 0.1 must pass).
FEASIBILITY_TOLERANCE = 1e-12


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the offending key or the numbers."""


class _Strict(BaseModel):
    # strict: TOML gives exact types, so `floor = true` or `lag = "8"` is a mistake, not a value.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ArmBounds(_Strict):
    """Bounds on one arm's sampling probability; they hold exactly after every update."""

    floor: float = Field(0.0, ge=0.0, le=1.0)
    cap: float = Field(1.0, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _floor_below_cap(self) -> ArmBounds:
        if self.floor > self.cap:
            raise ValueError(f"floor {self.floor} is above cap {self.cap}")
        return self


class Policy(_Strict):
    """One phase's mixing rules. See the module docstring for the file format."""

    reward: Reward = Field(
        IMPLICIT_REWARD,
        description="what the bandit rewards: the name of a reward of "
        "andrea.daemon.mixing.rewards, e.g. 'gated-plateau' (docs/bandit.md lists them)",
    )
    alpha: float = Field(
        0.9, ge=0.0, lt=1.0, description="EMA smoothing of the reward; 0 keeps only the last"
    )
    lag: int = Field(
        8,
        ge=1,
        le=4096,  # the most one assign request of the protocol carries
        description="W: steps between a step and the first draw its loss can influence",
    )
    arms: dict[str, ArmBounds] = Field(default_factory=dict)
    initial_weights: dict[str, float] = Field(
        default_factory=dict,
        description="relative weights of the first W draws (under gated-plateau, gated-fall, "
        "gated-heldout and gated-learnability-2, of the arms still to measure); unlisted arms weigh 1",
    )
    target: dict[str, float] = Field(
        default_factory=dict,
        # Left out when empty: every policy without a target keeps its fingerprint and its bytes.
        exclude_if=lambda v: not v,
        description="the arms whose held-out loss the run is for, each with a relative weight: "
        'a list of "ARM" or "ARM=W" (W: 1 when left out), or a table ARM = W; with a target '
        'the reward is "transfer-2" unless "transfer" is named (docs/bandit.md)',
    )

    @model_validator(mode="before")
    @classmethod
    def _target_reward(cls, data: object) -> object:
        # A target decides the reward: a policy that names a target and no reward means
        # TARGET_REWARD (and names it, so that it is not given the run's reward instead).
        if isinstance(data, dict) and data.get("target") and "reward" not in data:
            return {**data, "reward": TARGET_REWARD}
        return data

    @field_validator("target", mode="before")
    @classmethod
    def _parse_target(cls, value: object) -> object:
        return parse_target(value)

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, name: str) -> str:
        rewards.lookup(name)  # UnknownReward is a ValueError: pydantic reports it on the key
        return name

    @model_validator(mode="after")
    def _check(self) -> Policy:
        targeted = rewards.lookup(self.reward).targeted
        if self.target and not targeted:
            raise ValueError(
                f"target: a target is served by a reward that serves one "
                f"({', '.join(map(repr, TARGETED_REWARDS))}), not {self.reward!r} (leave "
                f"`reward` out for {TARGET_REWARD!r})"
            )
        if targeted and not self.target:
            raise ValueError(
                f'reward {self.reward!r} needs a target: target = ["ARM", "ARM=W", ...]'
            )
        for name in (*self.arms, *self.initial_weights, *self.target):
            if not re.fullmatch(ARM_NAME_PATTERN, name):
                raise ValueError(f"arm name {name!r} does not match {ARM_NAME_PATTERN}")
        check_target_weights(self.target)
        for name, w in self.initial_weights.items():
            # Bounded so that normalising never underflows to 0: the projection needs every
            # weight positive (a zero weight cannot be scaled up to meet a floor).
            if not MIN_INITIAL_WEIGHT <= w <= MAX_INITIAL_WEIGHT:
                raise ValueError(
                    f"initial_weights.{name} = {w}: weights are relative and must lie in "
                    f"[{MIN_INITIAL_WEIGHT:g}, {MAX_INITIAL_WEIGHT:g}]"
                )
        # With every listed arm live this is the floor total the bandit must honour; above 1 the
        # file can only be a mistake, whatever the configuration.
        floors = math.fsum(b.floor for b in self.arms.values())
        if floors > 1.0 + FEASIBILITY_TOLERANCE:
            listing = ", ".join(
                f"{n}={human(b.floor)}" for n, b in sorted(self.arms.items()) if b.floor > 0
            )
            raise ValueError(
                f"infeasible policy: the floors sum to {human(floors)} > 1 ({listing})"
            )
        return self

    def bounds(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(floors, caps) as float64 arrays in the order of `names`; unlisted arms get (0, 1)."""
        default = ArmBounds()
        rows = [self.arms.get(n, default) for n in names]
        return (
            np.array([b.floor for b in rows], dtype=np.float64),
            np.array([b.cap for b in rows], dtype=np.float64),
        )

    def initial_weight(self, name: str) -> float:
        return self.initial_weights.get(name, 1.0)

    def check_feasible(self, live: Iterable[str]) -> None:
        """Raise `PolicyError` unless the capped simplex over the `live` arms is non-empty:
        sum of floors <= 1 <= sum of caps (floors and caps of other arms do not count)."""
        live = sorted(live)
        if not live:
            raise PolicyError("no live arm: the bandit has nothing to draw from")
        lo, hi = self.bounds(live)
        floors, caps = math.fsum(lo), math.fsum(hi)
        if floors > 1.0 + FEASIBILITY_TOLERANCE:
            raise PolicyError(
                f"infeasible policy: the floors of the live arms sum to {human(floors)} > 1 "
                f"({_listing(live, lo)})"
            )
        if caps < 1.0 - FEASIBILITY_TOLERANCE:
            raise PolicyError(
                f"infeasible policy: the caps of the live arms sum to {human(caps)} < 1 "
                f"({_listing(live, hi)}); raise a cap or configure another arm"
            )

    def check_arms(self, configured: Iterable[str]) -> None:
        """Raise `PolicyError` naming every arm of the policy that the run does not configure (a
        misspelt `[arms.kode]` would otherwise be a bound on nothing)."""
        known = sorted(configured)
        strangers = sorted(set(self.target) - set(known))
        if strangers:
            raise PolicyError(
                f"the policy's target names arms this run does not have: {', '.join(strangers)} "
                f"(the run's arms: {', '.join(known)})"
            )
        unknown = sorted((set(self.arms) | set(self.initial_weights)) - set(known))
        if unknown:
            raise PolicyError(
                f"the policy names arms this run does not have: {', '.join(unknown)} "
                f"(the run's arms: {', '.join(known)})"
            )

    @property
    def names_reward(self) -> bool:
        """Whether the text this policy was read from said `reward = ...` (a policy that does not
        takes the reward of the run it joins, see `policystore`)."""
        return "reward" in self.model_fields_set

    def target_weights(self) -> dict[str, float]:
        """The target's arms with their weights normalised to sum to 1 (sorted by name; empty
        without a target)."""
        total = math.fsum(self.target.values())
        return {n: self.target[n] / total for n in sorted(self.target)}

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the policy (defaults included, keys sorted), except
        that the implicit reward is left out: the fingerprints of policies written before the
        reward could be chosen (recorded in states and pivot archives) stay what they were."""
        data = self.model_dump(mode="json")
        if data["reward"] == IMPLICIT_REWARD:
            del data["reward"]
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()


def _listing(names: Sequence[str], values: np.ndarray) -> str:
    return ", ".join(f"{n}={human(float(v))}" for n, v in zip(names, values))


def human(x: float) -> str:
    """A number as a person writes it: 0.9, not 0.8999999999999999 (six significant digits)."""
    return f"{x:.6g}"


def bounds_table(old: Policy, new: Policy, arms: Sequence[str]) -> list[dict[str, object]]:
    """Per arm: the floor and cap of `old` and `new`, and whether they differ."""
    rows = []
    for name in sorted(set(arms) | set(old.arms) | set(new.arms)):
        a, b = old.arms.get(name, ArmBounds()), new.arms.get(name, ArmBounds())
        rows.append(
            {
                "arm": name,
                "old_floor": a.floor,
                "old_cap": a.cap,
                "new_floor": b.floor,
                "new_cap": b.cap,
                "changed": a != b,
            }
        )
    return rows


def differences(old: Policy, new: Policy) -> list[str]:
    """Each setting that differs, as `key: old → new` (numbers rounded for people)."""
    out = []
    if old.reward != new.reward:
        out.append(f"reward: {old.reward} → {new.reward}")
    for key in ("alpha", "lag"):
        a, b = getattr(old, key), getattr(new, key)
        if a != b:
            out.append(f"{key}: {human(a)} → {human(b)}")
    for name in sorted(set(old.arms) | set(new.arms)):
        a, b = old.arms.get(name, ArmBounds()), new.arms.get(name, ArmBounds())
        for key in ("floor", "cap"):
            if getattr(a, key) != getattr(b, key):
                out.append(
                    f"arms.{name}.{key}: {human(getattr(a, key))} → {human(getattr(b, key))}"
                )
    if old.target != new.target:
        out.append(f"target: {said_target(old.target)} → {said_target(new.target)}")
    for name in sorted(set(old.initial_weights) | set(new.initial_weights)):
        a, b = old.initial_weight(name), new.initial_weight(name)
        if a != b:
            out.append(f"initial_weights.{name}: {human(a)} → {human(b)}")
    return out


def parse_target(value: object) -> object:
    """A target as the policy file (or `andreactl pivot --target`) writes it — a list of "ARM" or
    "ARM=W", or a table ARM = W — as {arm: weight}. Raises ValueError naming the bad item;
    anything else but a list is left to the field's own validation (a table, or a wrong type)."""
    if isinstance(value, dict):
        # TOML writes `code = 1` as an integer: a weight is a number either way.
        return {
            k: float(v) if isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in value.items()
        }
    if not isinstance(value, list):
        return value
    if not value:
        raise ValueError("an empty target names no arm; leave the key out for a run without one")
    out: dict[str, float] = {}
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f'each item is "ARM" or "ARM=W", got {item!r}')
        name, sep, weight = item.partition("=")
        name = name.strip()
        try:
            w = float(weight) if sep else 1.0
        except ValueError:
            raise ValueError(f"{item!r}: the weight {weight.strip()!r} is not a number") from None
        if name in out:
            raise ValueError(f"arm {name!r} is named twice")
        out[name] = w
    return out


def retargeted(policy: Policy, items: Sequence[str]) -> Policy:
    """`policy` with the target `items` ("ARM" or "ARM=W", as `andreactl pivot --target` takes
    them) and so the reward of a target (TARGET_REWARD); its caps, floors, lag and initial
    weights unchanged. Raises `PolicyError` naming the bad item."""
    data = {**policy.model_dump(mode="json"), "target": list(items), "reward": TARGET_REWARD}
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise PolicyError(describe(e, "invalid --target")) from None


def check_target_weights(target: dict[str, float]) -> None:
    """Raise ValueError for a weight out of its bounds (relative weights, finite and positive)."""
    for name, w in target.items():
        if not MIN_TARGET_WEIGHT <= w <= MAX_TARGET_WEIGHT:
            raise ValueError(
                f"target {name}={w}: weights are relative and must lie in "
                f"[{MIN_TARGET_WEIGHT:g}, {MAX_TARGET_WEIGHT:g}]"
            )


def said_target(target: dict[str, float]) -> str:
    """A target as people write it: `code, docs=0.5` (or `none`)."""
    if not target:
        return "none"
    return ", ".join(n if w == 1.0 else f"{n}={human(w)}" for n, w in sorted(target.items()))


def parse_policy(text: str, source: str = POLICY_FILE) -> Policy:
    """Parse and validate policy TOML text; `source` names it in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(f"{source}: not valid TOML: {e}") from None
    except RecursionError:
        raise PolicyError(f"{source}: nested too deeply to be a policy") from None
    try:
        return Policy.model_validate(data)
    except ValidationError as e:
        raise PolicyError(describe(e, f"invalid policy ({source})")) from None


#: The most a policy file may hold: a few lines per arm. A larger file, or anything but a regular
#: file (/dev/zero, a FIFO), is refused before it is read.
MAX_POLICY_BYTES = 1 << 20


def read_policy_text(path: str | Path) -> str:
    """The text of a policy file, read as a regular file of at most MAX_POLICY_BYTES (a link is
    followed: a person names the file). Raises `PolicyError` naming the file."""
    path = Path(path)
    try:
        # utf-8-sig: an editor's byte-order mark is not a TOML statement.
        return read_bounded(path, MAX_POLICY_BYTES, follow_symlinks=True).decode("utf-8-sig")
    except FileRejected as e:
        raise PolicyError(f"policy file {e}") from None
    except OSError as e:
        raise PolicyError(f"cannot read policy file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise PolicyError(f"{path}: not UTF-8 text: {e}") from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file. Raises `PolicyError` (unreadable, not a regular file, too
    large, bad TOML, unknown key, out-of-range value, floor above cap, floors summing above 1)."""
    return parse_policy(read_policy_text(path), str(path))
