"""``andreactl pivot``: the seed's polish pivot as one request to the proxy, which runs it whole.

The proxy holds the trainer at its next checkpoint boundary, archives ``.samples.json`` and
``.state.json`` with the old policy, starts a fresh bandit under the new one, and releases the
trainer with the new phase, which continues from exactly that step; then it answers. The client
only waits for that answer: killed at any moment, it leaves the run either in the old phase or in
the new one, never held (daemon/mixing/pivot_orchestrator.py). ``--dry-run`` asks the proxy to
check the policy against the live arms at the trainer's next boundary; ``--cancel`` releases a
hold without pivoting. ``--target ARM[=W]...`` instead of ``--policy`` pivots to the policy in
force with that target (docs/bandit.md, "A target: the transfer reward"): the request carries the
items and the proxy, which owns the policy in force, makes the new policy (``policy.retargeted``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from andrea.control import reports
from andrea.control.commands.conventions import EXIT_OK, Command, CommandFailed, UserError, emit
from andrea.control.commands.daemons import ask
from andrea.control.commands.status import status_report
from andrea.control.offline import daemon_running
from andrea.protocol import messages
from andrea.protocol.status import HoldState, ProxyStatus, TrainerStatus
from andrea.protocol.transport import PeerGone, new_id

#: What the proxy may take beyond --timeout: the commit, the release, a slow machine.
ANSWER_MARGIN_S = 120.0
#: The refusals that are the request's fault (exit 2): the policy, a pivot that changes nothing.
USAGE_REFUSALS = ("policy", "no-op")


class _Failed(Exception):
    """The run refused or did not answer: one line, exit code 1."""


def _pivot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, help="the new policy (caps and floors) as TOML")
    parser.add_argument(
        "--target",
        nargs="+",
        metavar="ARM[=W]",
        help="instead of --policy: the policy in force with this target (the arms whose held-out "
        "loss the run is for, weights relative, 1 when left out) and so the transfer reward; "
        "caps, floors, lag and initial weights unchanged",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the policy against the live arms and show old → new bounds and the boundary "
        "step it would use; change nothing",
    )
    parser.add_argument(
        "--force", action="store_true", help="start a new phase even if the policy is unchanged"
    )
    parser.add_argument(
        "--cancel",
        action="store_true",
        help="release a trainer held by a pivot, without pivoting",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="the proxy gives the pivot up (and releases the trainer) unless the trainer holds "
        "at a boundary within this many seconds",
    )
    parser.add_argument(
        "--hold-timeout",
        type=float,
        default=600.0,
        help="the trainer releases itself after holding this long without a resume (a safety net "
        "for a proxy that dies mid-pivot)",
    )


def cmd_pivot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Pivot the run to the policy of --policy (or the one in force with the target of --target)
    at the trainer's next boundary (see the module).

    One request to the proxy, one answer. Everything that can be checked is checked before the
    trainer is held (the policy, its arms and feasibility against the live arms, an unchanged
    policy); a refusal changes nothing (exit 2). `--cancel` releases a hold."""
    try:
        if args.cancel:
            return _cancel(args)
        new = _new_policy(args)
        if args.dry_run:
            return _dry_run(args, new)
        return _pivot(args, new)
    except _Failed as e:
        raise CommandFailed(str(e)) from None


def _live(args: argparse.Namespace) -> tuple[TrainerStatus, ProxyStatus | None]:
    """The daemons' live status; a dry run, or a cancel, needs at least the trainer's."""
    status = status_report(args.run_dir)
    if status.trainer is None:
        raise _Failed("a pivot needs the trainer running and answering")
    return status.trainer, status.proxy


@dataclass(frozen=True)
class _NewPolicy:
    """What the request carries: a policy's text, or a target for the proxy to set."""

    text: str | None = None
    target: list[str] | None = None


def _new_policy(args: argparse.Namespace) -> _NewPolicy:
    """The new policy's text, once it parses as a policy; or the --target items, once they parse
    as a target. The proxy retargets the policy in force itself (it owns that policy) and checks
    the arms against the run's."""
    # The policy's code is the bandit's (numpy models, tens of milliseconds to import): only a
    # pivot pays for it.
    from andrea.daemon.mixing.policy import (
        Policy,
        PolicyError,
        parse_policy,
        read_policy_text,
        retargeted,
    )

    if args.policy is not None and args.target is not None:
        raise UserError("pivot takes --policy FILE or --target ARM[=W]..., not both")
    if args.policy is None and args.target is None:
        raise UserError("pivot needs --policy FILE or --target ARM[=W]... (or --cancel)")
    try:
        if args.target is not None:
            # The items' syntax and weights, before anything is asked: the proxy checks them
            # again against the policy in force and the run's arms.
            retargeted(Policy(), args.target)
            return _NewPolicy(target=list(args.target))
        # Read once, bounded: the text checked here is the text the proxy gets.
        text = read_policy_text(args.policy)
        parse_policy(text, str(args.policy))
        return _NewPolicy(text=text)
    except PolicyError as e:
        raise UserError(str(e)) from None


def _refused(reply: messages.Reply, dry_run: bool) -> Exception:
    """The proxy's refusal: a usage error when it is the request's fault (any of a dry run's),
    else a failure (another pivot in progress, the trainer gone, a hold cancelled)."""
    if dry_run or reply.data.get("kind") in USAGE_REFUSALS:
        return UserError(f"pivot refused, nothing was changed: {reply.error}")
    return _Failed(f"pivot refused: {reply.error}")


def _pivot(args: argparse.Namespace, new: _NewPolicy) -> int:
    """The one request, and its answer once the proxy has held, committed and released."""
    if not daemon_running(args.run_dir, "proxy"):
        raise _Failed("a pivot needs the proxy running and answering; nothing was changed")
    print(
        "pivot: the proxy holds the trainer at its next checkpoint boundary, starts the new phase "
        "there and releases it; waiting for its answer",
        file=sys.stderr,
    )
    request = messages.PivotRequest(
        id=new_id(),
        policy_toml=new.text,
        target=new.target,
        force=args.force,
        timeout_s=args.timeout,
        hold_timeout_s=args.hold_timeout,
    )
    try:
        result = ask(
            args.run_dir,
            "proxy",
            request,
            timeout=args.timeout + ANSWER_MARGIN_S,
            retries=1,
            alive=lambda: daemon_running(args.run_dir, "proxy"),
        )
    except PeerGone:
        raise _Failed(
            "the proxy exited during the pivot; the trainer continues under the phase the "
            "restarted proxy has (see `andreactl status`)"
        ) from None
    if result is None:
        raise _Failed("the proxy did not answer: a pivot needs the proxy running and answering")
    if not result.ok:
        raise _refused(result, dry_run=False)
    report = _pivot_report(result.data, dry_run=False)
    emit(
        args,
        report,
        f"pivot done: phase {report.phase} starts after step {report.boundary_step}; the ended "
        f"phase is archived in {report.archive}\n" + _bounds_text(report),
    )
    return EXIT_OK


def _next_boundary(trainer: TrainerStatus) -> int:
    every, step = trainer.checkpoint_every, trainer.step
    return step + 1 if every == 0 else (step // every + 1) * every


def _dry_run(args: argparse.Namespace, new: _NewPolicy) -> int:
    """The proxy's check of the policy at the trainer's next boundary; nothing is changed."""
    trainer, proxy = _live(args)
    if proxy is None:
        raise _Failed("a pivot needs the proxy running and answering")
    if trainer.mixing != "proxy":
        raise _Failed("the trainer uses a fixed mixture; there is no bandit to pivot")
    check = ask(
        args.run_dir,
        "proxy",
        messages.PivotRequest(
            id=new_id(),
            policy_toml=new.text,
            target=new.target,
            boundary_step=_next_boundary(trainer),
            dry_run=True,
            force=args.force,
        ),
        timeout=30,
        retries=1,
    )
    if check is None:
        raise _Failed("the proxy did not answer the policy check; nothing was changed")
    if not check.ok:
        raise _refused(check, dry_run=True)
    report = _pivot_report(check.data, dry_run=True)
    emit(
        args,
        report,
        f"dry run: phase {report.phase - 1} (policy {report.old_policy[:12]}) would end and "
        f"phase {report.phase} (policy {report.new_policy[:12]}) start after step "
        f"{report.boundary_step} (the trainer's next checkpoint boundary; it is at step "
        f"{trainer.step})\n" + _bounds_text(report) + "\nnothing was changed",
    )
    return EXIT_OK


def _pivot_report(data: dict, dry_run: bool) -> reports.PivotReport:
    live = set(data.get("live_arms", []))
    return reports.PivotReport(
        time=reports.utc_now(),
        dry_run=dry_run,
        phase=data["phase"] + 1 if dry_run else data["phase"],
        boundary_step=data["boundary_step"],
        archive=None if dry_run else data.get("archive"),
        already=bool(data.get("already")),
        old_policy=data["old_policy"],
        new_policy=data["new_policy"],
        changes=data["changes"],
        bounds=[reports.BoundsRow(**row, live=row["arm"] in live) for row in data["bounds"]],
    )


def _bounds_text(report: reports.PivotReport) -> str:
    from andrea.daemon.mixing.policy import human

    rows = [f"{'arm':<16} {'floor':>16} {'cap':>16}"]
    for b in report.bounds:
        floor = f"{human(b.old_floor)} → {human(b.new_floor)}"
        cap = f"{human(b.old_cap)} → {human(b.new_cap)}"
        note = "" if b.live else "  (not live: ignored)"
        rows.append(f"{'*' if b.changed else ' '}{b.arm:<15} {floor:>16} {cap:>16}{note}")
    return "\n".join(rows)


def _release(args: argparse.Namespace, hold_id: str) -> messages.Reply | None:
    return ask(args.run_dir, "trainer", messages.ResumeRequest(id=new_id(), hold_id=hold_id))


def _cancel(args: argparse.Namespace) -> int:
    """Release the trainer's hold without pivoting (the proxy may have pivoted already)."""
    trainer, proxy = _live(args)
    hold = trainer.hold
    if hold is None or hold.state is HoldState.FAILED:
        raise UserError("the trainer holds for no pivot; nothing to cancel")
    if hold.state is HoldState.PENDING:
        print(
            f"pivot: cancelling hold {hold.id} of a pivot still waiting for its boundary "
            f"(the proxy, pid {hold.owner_pid}, gives that pivot up)",
            file=sys.stderr,
        )
    reply = _release(args, hold.id)
    if reply is None or not reply.ok:
        raise _Failed(f"the trainer did not release hold {hold.id}: {reply and reply.error}")
    pivoted = (
        proxy is not None
        and hold.step is not None
        and proxy.phase > 0
        and proxy.phase_start_step == hold.step
    )
    report = reports.PivotCancelReport(
        time=reports.utc_now(), hold_id=hold.id, outcome=reply.data["outcome"], pivoted=pivoted
    )
    emit(
        args,
        report,
        f"hold {hold.id} {report.outcome}; "
        + (
            f"the proxy had already started phase {proxy.phase} after step {hold.step}, "
            "which stays in force"
            if pivoted and proxy is not None
            else "no pivot was made; the trainer continues under the current phase"
        ),
    )
    return EXIT_OK


PIVOT = Command(
    "pivot",
    "start a new bandit phase under a new policy at the next boundary",
    _pivot_arguments,
    cmd_pivot,
    examples=(
        "andreactl pivot --run-dir runs/r1 --policy polish.toml --dry-run",
        "andreactl pivot --run-dir runs/r1 --policy polish.toml",
        "andreactl pivot --run-dir runs/r1 --target code docs=0.5",
        "andreactl pivot --run-dir runs/r1 --cancel",
    ),
)
