"""A pivot's commit: a new phase, with a new policy and a fresh bandit, for the steps after a
boundary.

Two ways in: `andreactl pivot` (a `pivot` request, checked whole before anything happens, then run
by `pivot_orchestrator`, which commits here once the trainer holds at its boundary), and the
seed's manual pivot (the run's policy file changed while the proxy was stopped; its boundary is
the trainer's newest intact checkpoint). Both end in `PhaseCommit.pivot`, crash-safe in this order:
the policy file, the archive of the ending phase (written from memory; the live files are not
moved), then the new `.state.json`, the commit. A crash before the commit leaves the old state
beside the new policy file, which the next start completes as a manual pivot at the same boundary.
"""

from __future__ import annotations

import logging
from pathlib import Path

from andrea.daemon.mixing.archive import write_archive
from andrea.daemon.mixing.bandit import Bandit
from andrea.daemon.mixing.policy import (
    Policy,
    PolicyError,
    bounds_table,
    differences,
    parse_policy,
    retargeted,
)
from andrea.daemon.mixing.policystore import store, to_toml, with_reward
from andrea.daemon.mixing.run_state import ProxyRunState
from andrea.daemon.mixing.startup import manual_pivot_boundary
from andrea.daemon.rundir.layout import LOSS_FILE, POLICY_FILE
from andrea.protocol import messages

log = logging.getLogger(__name__)


def _refuse(msg: messages.PivotRequest, error: str, **data: object) -> messages.Reply:
    return messages.Reply(id=msg.id, ok=False, error=error, data=data)


class PhaseCommit:
    def __init__(self, run_state: ProxyRunState) -> None:
        self.run_state = run_state

    def manual(self) -> None:
        """The policy file changed while the proxy was stopped: the seed's manual pivot. Its
        boundary is the trainer's newest intact checkpoint, where `andreactl pivot` would have held
        it. Steps the trainer trained after it under the old policy stay in .loss.json, superseded;
        the trainer rolls back to the boundary by itself when it hears of the new phase."""
        run_state = self.run_state
        old = run_state.book.bandit.policy
        run_state.check_policy(run_state.opts.policy)
        boundary = manual_pivot_boundary(run_state.run_dir, run_state.book)
        log.info(
            "%s changed while the proxy was stopped (%s): a pivot after the newest checkpoint, step %d",
            POLICY_FILE,
            "; ".join(differences(old, run_state.opts.policy)) or "same bounds",
            boundary,
        )
        if run_state.durable_step > boundary:
            log.info(
                "steps %d..%d were trained under the old policy: they stay in %s as superseded "
                "entries and the trainer rolls back to step %d",
                boundary + 1,
                run_state.durable_step,
                LOSS_FILE,
                boundary,
            )
        self.pivot(boundary, run_state.opts.policy)
        run_state.supersede_after(boundary)

    def policy_of(self, msg: messages.PivotRequest) -> tuple[Policy, str] | messages.Reply:
        """The request's policy (with the run's reward) and its text, or the refusal. A target
        instead of a text retargets the policy in force (its caps, floors, lag and initial
        weights kept): the proxy makes it, as it owns that policy."""
        run_state = self.run_state
        in_force = run_state.book.bandit.policy
        try:
            if msg.target is not None:
                policy = retargeted(in_force, msg.target)
                policy_toml = to_toml(policy)
            else:
                assert msg.policy_toml is not None  # the message's own check: one of the two
                policy, policy_toml = with_reward(
                    parse_policy(msg.policy_toml, source="pivot policy"),
                    msg.policy_toml,
                    in_force.reward,
                )
            run_state.check_policy(policy)
        except PolicyError as e:
            return _refuse(msg, str(e), kind="policy")
        return policy, policy_toml

    def check(self, msg: messages.PivotRequest) -> messages.Reply | None:
        """Everything that can be checked before the trainer holds (the policy, its arms and
        feasibility, a no-op; with a boundary, the boundary): the refusal, a dry run's answer,
        or None to go ahead. Nothing is changed."""
        checked = self.policy_of(msg)
        if isinstance(checked, messages.Reply):
            return checked
        policy, _ = checked
        b = msg.boundary_step
        return self._without_pivot(msg, policy, b, self._preview(b, policy))

    def commit(self, msg: messages.PivotRequest, b: int) -> messages.Reply:
        """The pivot of `msg` after step `b`, where the trainer holds: checked again (the run may
        have changed since the request), then made. A refusal changes nothing."""
        run_state = self.run_state
        checked = self.policy_of(msg)
        if isinstance(checked, messages.Reply):
            return checked
        policy, policy_toml = checked
        data = self._preview(b, policy)
        answer = self._without_pivot(msg, policy, b, data)
        if answer is not None:
            return answer
        # The policy file first: if the proxy dies before the new state is written, its next start
        # sees the changed policy and completes the same pivot (at the newest checkpoint, b).
        store(run_state.run_dir, policy_toml)
        archive = self.pivot(b, policy)
        return messages.Reply(
            id=msg.id,
            ok=True,
            data={
                **data,
                "phase": run_state.book.bandit.phase,
                "archive": str(archive.relative_to(run_state.run_dir)),
            },
        )

    def _preview(self, b: int | None, policy: Policy) -> dict[str, object]:
        """What a pivot after step `b` to `policy` would change (every reply carries it)."""
        bandit = self.run_state.book.bandit
        current = bandit.policy
        table = bounds_table(current, policy, [c.name for c in self.run_state.configured])
        return {
            "phase": bandit.phase,
            "phase_start_step": bandit.phase_start_step,
            "boundary_step": b,
            "old_policy": current.fingerprint(),
            "new_policy": policy.fingerprint(),
            "bounds": table,
            "changes": differences(current, policy),
            "live_arms": bandit.live_arms,
        }

    def _without_pivot(
        self, msg: messages.PivotRequest, policy: Policy, b: int | None, data: dict[str, object]
    ) -> messages.Reply | None:
        """The answer when no pivot is to be made (a no-op, a dry run, a boundary that cannot be),
        or None to go ahead. Without a boundary `b` (the trainer has not held
        yet) only what does not depend on it is checked."""
        book = self.run_state.book
        bandit = book.bandit
        same = bandit.policy.fingerprint() == policy.fingerprint()
        if same and not msg.force:
            return _refuse(
                msg,
                f"the run already uses this policy (fingerprint {policy.fingerprint()[:12]}…, phase "
                f"{bandit.phase}): a pivot would change nothing; pass --force for a new phase anyway",
                kind="no-op",
                **data,
            )
        if b is not None and b < book.phase_start:
            return _refuse(
                msg,
                f"cannot pivot after step {b}: phase {bandit.phase} starts after step "
                f"{book.phase_start}",
                kind="boundary",
                **data,
            )
        if msg.dry_run:
            return messages.Reply(id=msg.id, ok=True, data={**data, "dry_run": True})
        if b is None:
            return None
        return self._progress_refusal(msg, b, data)

    def _progress_refusal(
        self, msg: messages.PivotRequest, b: int, data: dict[str, object]
    ) -> messages.Reply | None:
        """A boundary must be exactly where the trainer is (held there for the pivot)."""
        trainer_step, book = self.run_state.trainer_step, self.run_state.book
        if b > trainer_step:
            return _refuse(
                msg,
                f"cannot pivot after step {b}: it is beyond the trainer's progress (its losses are "
                f"logged up to step {trainer_step})",
                kind="boundary",
                **data,
            )
        if b < trainer_step:
            return _refuse(
                msg,
                f"cannot pivot after step {b}: the trainer has already trained up to step "
                f"{trainer_step} under the current policy",
                kind="boundary",
                **data,
            )
        if b == book.phase_start and book.bandit.phase > 0:
            return messages.Reply(
                id=msg.id,
                ok=False,
                error=f"phase {book.bandit.phase} already starts after step {b}",
            )
        return None

    def pivot(self, boundary: int, policy: Policy) -> Path:
        """Archive the ending phase, then start a fresh bandit for the steps after `boundary`;
        returns the archive."""
        run_state = self.run_state
        old = run_state.book.bandit
        run_state.write_state()
        archive = write_archive(run_state.run_dir, boundary, old, policy)
        bandit = Bandit(
            run_state.configured,
            policy,
            seed=run_state.opts.cfg.seed,
            phase=old.phase + 1,
            start_step=boundary,
        )
        run_state.start_phase(bandit, policy)
        log.info(
            "pivot: phase %d starts after step %d under policy %s; phase %d archived in %s",
            bandit.phase,
            boundary,
            policy.fingerprint()[:12],
            old.phase,
            archive.relative_to(run_state.run_dir),
        )
        return archive
