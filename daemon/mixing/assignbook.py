"""Deterministic assignment of arms to steps: the proxy's memory of what it decided and why.

The arm of step s is a pure function of (seed, phase, policy, the canonical loss records of the
phase's steps <= s - W: each one's loss, and the held-out evaluation the record after one carries).
This book makes that true across crashes of either process:

- every assignment made is remembered (`arm_of`) and re-served as is, e.g. to a trainer that
  restarted from an older checkpoint; after a proxy restart the trained steps' arms come back from
  .loss.json and the rest are recomputed, which gives the same arms;
- losses are incorporated lazily, in step order, only as far as the next assignment needs;
- under a reward whose draw counts the steps pending (`Bandit.counts_pending`), the steps between
  s - W and s are assigned before s, so a trainer that asks for a later step first (after a restart of
  either process) gets the same arms as one that asked in order;
- a loss trained under a phase that did not own its step (a step after a pivot's boundary that the
  trainer had already trained under the old policy) is superseded: it stays in .loss.json but
  counts for nothing here;
- a bandit snapshot is kept every SNAPSHOT_EVERY incorporated steps, and the one persisted in
  .state.json is old enough (<= durable step + 1 - W) that every assignment a restarted proxy may
  have to recompute lies after it. Replaying the logged losses from there is cheap.

Pure logic, no I/O: the proxy feeds it losses and asks it for arms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from andrea.daemon.mixing.bandit import Bandit, BanditState, ConfiguredArm
from andrea.daemon.mixing.reward import MAX_EXP_LOSS

SNAPSHOT_EVERY = 32


class AssignmentBook:
    def __init__(
        self,
        bandit: Bandit,
        configured: Sequence[ConfiguredArm],
        past: dict[int, str] | None = None,
        starts: dict[int, int] | None = None,
    ) -> None:
        """`starts`: phase → the step after which it starts, for every phase up to the bandit's."""
        self.bandit = bandit
        self.configured = list(configured)
        self.lag = bandit.policy.lag
        #: Arms of steps of earlier phases, re-served to a trainer that resumes before the pivot.
        self.past: dict[int, str] = dict(past or {})
        self.starts: dict[int, int] = {
            0: 0,
            **(starts or {}),
            bandit.phase: bandit.phase_start_step,
        }
        self.arm_of: dict[int, str] = {}
        self.loss_of: dict[int, float] = {}
        self.heldout_of: dict[int, dict[str, float]] = {}
        self.probe_of: dict[int, dict[str, float]] = {}
        self.snapshots: list[BanditState] = [bandit.state_dict()]

    @property
    def phase_start(self) -> int:
        return self.bandit.phase_start_step

    def phase_of(self, step: int) -> int:
        """The phase that owns `step`: the newest one that starts before it."""
        return max(p for p, start in self.starts.items() if start < step or p == 0)

    def record(
        self,
        step: int,
        arm: str,
        loss: float,
        phase: int,
        heldout: Mapping[str, float] | None = None,
        probe: Mapping[str, float] | None = None,
    ) -> bool:
        """A trained step's loss, and the held-out and probe losses its record carries; False when it is
        superseded (trained under a phase that does not own the step). The first one recorded per
        step is canonical for the bandit (later segments re-training the step produce the same
        values in a bit-exact run)."""
        if phase != self.phase_of(step):
            return False
        if step <= self.phase_start:
            self.past[step] = arm
            return True
        if step not in self.loss_of:
            self.loss_of[step] = loss
            self.arm_of.setdefault(step, arm)
            if heldout is not None:
                self.heldout_of[step] = dict(heldout)
            if probe is not None:
                self.probe_of[step] = dict(probe)
        return True

    def assign(self, step: int) -> str | None:
        """The arm for `step`, or None while the loss it depends on has not arrived yet."""
        if step <= self.phase_start:
            if step not in self.past:
                raise ValueError(f"step {step} belongs to an earlier phase and was never trained")
            return self.past[step]
        if step in self.arm_of:
            return self.arm_of[step]
        need = max(self.phase_start, step - self.lag)
        between = range(need + 1, step)
        if self.bandit.counts_pending:
            if self.waiting_for(step) is not None:
                return None
            # The arms of the steps in between are inputs of this one: assign them first (their
            # own inputs are then all known: the losses up to `need`, and the steps before them).
            for j in between:
                if j not in self.arm_of:
                    self.assign(j)
        if self.bandit.last_step > need:
            self._rewind(need)
        if not self.incorporate(need):
            return None
        pending = [self.arm_of[j] for j in between] if self.bandit.counts_pending else None
        arm = self.bandit.assign(step, pending)
        self.arm_of[step] = arm
        return arm

    def incorporate(self, need: int) -> bool:
        """Fold the recorded losses into the bandit, in step order, up to step `need`; False when
        one of them has not arrived yet (the bandit then stands just before it)."""
        while self.bandit.last_step < need:
            j = self.bandit.last_step + 1
            if j not in self.loss_of:
                return False
            loss = self.loss_of[j]
            # A diverged step (NaN/inf) counts as the hardest possible instead of the bandit
            # refusing to go on: the loss reward saturates; under the learnability reward the
            # arm's loss EMA jumps up, which sets no new low (no progress) until it comes down.
            self.bandit.observe(
                j,
                self.arm_of[j],
                loss if math.isfinite(loss) else MAX_EXP_LOSS,
                self.heldout_of.get(j),
                self.probe_of.get(j),
            )
            if j % SNAPSHOT_EVERY == 0:
                self.snapshots.append(self.bandit.state_dict())
        return True

    def next_phase(self, bandit: Bandit) -> AssignmentBook:
        """The book of the phase that starts after `bandit.phase_start_step`: every assignment past
        that step is forgotten (it was made under the old policy), the trained ones are kept."""
        past = {
            **self.past,
            **{s: a for s, a in self.arm_of.items() if s <= bandit.phase_start_step},
        }
        return AssignmentBook(bandit, self.configured, past, self.starts)

    def waiting_for(self, step: int) -> int | None:
        """The step whose loss `assign(step)` is waiting for, if any."""
        need = max(self.phase_start, step - self.lag)
        j = self.bandit.last_step + 1
        while j <= need:
            if j not in self.loss_of:
                return j
            j += 1
        return None

    def _rewind(self, need: int) -> None:
        base = max((s for s in self.snapshots if s.last_step <= need), key=lambda s: s.last_step)
        self.bandit = Bandit.from_state(base, self.configured)
        self.snapshots = [s for s in self.snapshots if s.last_step <= base.last_step]

    def persistable(self, durable_step: int) -> BanditState:
        """The newest snapshot a restarted proxy can safely continue from, given that the losses
        of steps <= durable_step are on disk."""
        limit = durable_step + 1 - self.lag
        ok = [s for s in self.snapshots if s.last_step <= max(limit, self.phase_start)]
        # Older snapshots are never needed again once a newer one is persistable.
        newest = max(ok, key=lambda s: s.last_step)
        self.snapshots = [s for s in self.snapshots if s.last_step >= newest.last_step]
        return newest
