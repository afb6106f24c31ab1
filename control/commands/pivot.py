"""``andreactl pivot``: the seed's polish pivot as one command. The trainer checkpoints at its next
cadence boundary and holds; the proxy archives ``.samples.json`` and ``.state.json`` with the old
policy and starts a fresh bandit under the new one; the trainer continues from exactly that step.

The pivot runs in four stages, one function each: *preflight* checks everything that can be checked
before the trainer is asked anything (the policy, both daemons, a hold in progress, the proxy's dry
run of the policy against the live arms); *request* asks the trainer to hold at its next boundary;
*await* polls until it holds there; *commit* has the proxy start the new phase and releases the
trainer. ``--cancel`` releases a hold without pivoting.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andrea.control import reports
from andrea.control.commands.conventions import EXIT_OK, Command, CommandFailed, UserError, emit
from andrea.control.commands.daemons import ask
from andrea.control.commands.status import status_report
from andrea.daemon.rundir.layout import PIVOT_LOCK
from andrea.protocol import messages
from andrea.protocol.status import Activity, HoldState, HoldStatus, ProxyStatus, TrainerStatus
from andrea.protocol.transport import new_id

#: How much older than the moment it is read a trainer's status can be (it is cached for 0.1 s).
STATUS_LAG_S = 1.0


class _Failed(Exception):
    """The run refused or did not answer: one line, exit code 1."""


@dataclass(frozen=True)
class _Preflight:
    """What the checks before the hold found: the pivot to make."""

    policy_toml: str
    check: dict[str, Any]  # the proxy's answer to the dry run
    trainer: TrainerStatus
    resuming: HoldStatus | None  # the hold of an interrupted pivot that this one completes


def _pivot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", type=Path, help="the new policy (caps and floors) as TOML")
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
        help="release a trainer held by an interrupted pivot, without pivoting",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="give up waiting for the boundary after this many seconds",
    )
    parser.add_argument(
        "--hold-timeout",
        type=float,
        default=600.0,
        help="the trainer releases itself after holding this long without a resume (a safety net "
        "for a client that dies mid-pivot)",
    )


def cmd_pivot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Pivot the run to the policy of --policy at the trainer's next boundary (see the module).

    Everything that can be checked is checked before the trainer is asked to hold (the policy, its
    arms and feasibility against the live arms, an unchanged policy); a refusal changes nothing
    (exit 2). Re-running after an interrupted pivot completes it; `--cancel` releases it."""
    try:
        if args.cancel:
            return _cancel(args)
        text = _read_policy(args)
        with _pivot_client(args.run_dir, args.dry_run):
            plan = _preflight(args, text)
            if args.dry_run:
                return _show_dry_run(args, plan)
            hold_id = _request_hold(args, plan)
            boundary = _await_hold(args, hold_id, seen=plan.resuming is not None)
            return _commit(args, plan, hold_id, boundary)
    except _Failed as e:
        raise CommandFailed(str(e)) from None


def _live(args: argparse.Namespace) -> tuple[TrainerStatus, ProxyStatus | None]:
    """The daemons' live status; a pivot, or its cancel, needs at least the trainer's."""
    status = status_report(args.run_dir)
    if status.trainer is None:
        raise _Failed("a pivot needs the trainer running and answering")
    return status.trainer, status.proxy


# --- preflight ------------------------------------------------------------------------------------------


def _read_policy(args: argparse.Namespace) -> str:
    """The new policy's text, once it parses as a policy."""
    # The policy's code is the bandit's (numpy models, tens of milliseconds to import): only a
    # pivot pays for it.
    from andrea.daemon.mixing.policy import PolicyError, parse_policy, read_policy_text

    if args.policy is None:
        raise UserError("pivot needs --policy FILE (or --cancel)")
    try:
        # Read once, bounded: the text checked here is the text the proxy gets.
        text = read_policy_text(args.policy)
        parse_policy(text, str(args.policy))
        return text
    except PolicyError as e:
        raise UserError(str(e)) from None


#: Never through a link, never blocking on a FIFO planted there.
_LOCK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextmanager
def _pivot_client(run_dir: Path, dry_run: bool) -> Iterator[None]:
    """Be the run's pivot client while the pivot runs: hold RUN/.pivot.lock (a flock; nothing is
    written, so another user's client can take it too). A pivot in progress is known by its
    client's lock, never by the pid its hold names: a client in another pid namespace has a pid
    that means nothing here. A dry run takes nothing."""
    if dry_run:
        yield
        return
    path = run_dir / PIVOT_LOCK
    try:
        fd = os.open(path, _LOCK_FLAGS | os.O_CREAT, 0o644)
    except OSError as e:
        raise _Failed(f"cannot open {path}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Failed(f"{path} is not a regular file: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _Failed(
                "another pivot is in progress (another andreactl pivot holds "
                f"{path}); wait for it, or cancel it with `andreactl pivot --cancel`"
            ) from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _other_client(run_dir: Path) -> bool:
    """Whether another andreactl pivot holds the run's pivot lock (a shared probe, never created)."""
    try:
        fd = os.open(run_dir / PIVOT_LOCK, _LOCK_FLAGS)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _interrupted_hold(args: argparse.Namespace, trainer: TrainerStatus) -> HoldStatus | None:
    """The hold of an interrupted pivot, which this one completes; refused while its client lives.
    Only a dry run looks: any other pivot holds the pivot lock itself (`_pivot_client`), so no
    other client lives."""
    hold = trainer.hold
    if hold is None or hold.state is HoldState.FAILED:
        return None
    if args.dry_run and _other_client(args.run_dir):
        raise _Failed(
            f"another pivot is in progress (hold {hold.id}, andreactl pid {hold.owner_pid}); "
            "wait for it, or cancel it with `andreactl pivot --cancel`"
        )
    print(
        f"pivot: completing an interrupted pivot (hold {hold.id}, {hold.state}"
        + (f" after step {hold.step}" if hold.step is not None else "")
        + ")",
        file=sys.stderr,
    )
    return hold


def _next_boundary(trainer: TrainerStatus) -> int:
    every, step = trainer.checkpoint_every, trainer.step
    return step + 1 if every == 0 else (step // every + 1) * every


def _preflight(args: argparse.Namespace, text: str) -> _Preflight:
    """Both daemons answer, the trainer mixes through the proxy, and the proxy's dry run accepts the
    policy at the boundary the pivot would use; nothing is changed by any of it."""
    trainer, proxy = _live(args)
    if proxy is None:
        raise _Failed("a pivot needs the proxy running and answering")
    if trainer.mixing != "proxy":
        raise _Failed("the trainer uses a fixed mixture; there is no bandit to pivot")
    resuming = _interrupted_hold(args, trainer)
    boundary = resuming.step if resuming is not None and resuming.step is not None else None
    check = ask(
        args.run_dir,
        "proxy",
        messages.PivotRequest(
            id=new_id(),
            policy_toml=text,
            boundary_step=boundary or _next_boundary(trainer),
            dry_run=True,
            force=args.force,
        ),
        timeout=30,
        retries=1,
    )
    if check is None:
        raise _Failed("the proxy did not answer the policy check; nothing was changed")
    if not check.ok and not (resuming is not None and check.data.get("kind") == "no-op"):
        raise UserError(f"pivot refused, nothing was changed: {check.error}")
    return _Preflight(text, check.data, trainer, resuming)


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


def _show_dry_run(args: argparse.Namespace, plan: _Preflight) -> int:
    report = _pivot_report(plan.check, dry_run=True)
    emit(
        args,
        report,
        f"dry run: phase {report.phase - 1} (policy {report.old_policy[:12]}) would end and "
        f"phase {report.phase} (policy {report.new_policy[:12]}) start after step "
        f"{report.boundary_step} (the trainer's next checkpoint boundary; it is at step "
        f"{plan.trainer.step})\n" + _bounds_text(report) + "\nnothing was changed",
    )
    return EXIT_OK


# --- request, await -------------------------------------------------------------------------------------


def _request_hold(args: argparse.Namespace, plan: _Preflight) -> str:
    """The id of the hold the pivot releases: a new one at the trainer's next boundary, or the
    interrupted pivot's."""
    if plan.resuming is not None:
        return plan.resuming.id
    reply = ask(
        args.run_dir,
        "trainer",
        messages.CheckpointRequest(
            id=new_id(),
            boundary=True,
            hold=True,
            hold_owner_pid=os.getpid(),
            hold_timeout_s=args.hold_timeout,
        ),
    )
    if reply is None or not reply.ok:
        raise _Failed(
            f"the trainer did not accept the hold: {reply.error if reply else 'no answer'}"
        )
    hold_id = reply.data["hold_id"]
    print(
        f"pivot: the trainer will checkpoint at its next boundary and hold (hold {hold_id}, "
        f"now at step {plan.trainer.step})",
        file=sys.stderr,
    )
    return hold_id


def _release(args: argparse.Namespace, hold_id: str) -> messages.Reply | None:
    return ask(args.run_dir, "trainer", messages.ResumeRequest(id=new_id(), hold_id=hold_id))


def _await_hold(args: argparse.Namespace, hold_id: str, seen: bool) -> int | None:
    """The step after which the trainer holds under ``hold_id``, once it does and says so."""
    accepted = time.monotonic()
    deadline = accepted + args.timeout
    last_answer = accepted
    while True:
        asked = time.monotonic()
        t = status_report(args.run_dir).trainer
        if t is not None:
            last_answer = time.monotonic()
        elif time.monotonic() - last_answer > 30:
            raise _Failed("the trainer stopped answering; nothing was changed")
        h = t.hold if t is not None else None
        # A status may be a moment older than the hold request (the trainer caches it): the hold
        # counts as gone once it has been seen, or once no status can predate the request (a
        # cancel may come before this client ever saw its hold).
        seen = seen or (h is not None and h.id == hold_id) or asked - accepted > STATUS_LAG_S
        if h is not None and h.id == hold_id and h.state is HoldState.HOLDING and h.acknowledged:
            return h.step
        if seen and t is not None and (h is None or h.id != hold_id):
            raise _Failed(f"hold {hold_id} is gone (cancelled or timed out); nothing was changed")
        if h is not None and h.state is HoldState.FAILED:
            raise _Failed(f"the trainer could not hold: {h.error}; nothing was changed")
        if time.monotonic() > deadline or (t is not None and t.activity is Activity.STOPPING):
            _release(args, hold_id)
            raise _Failed("the trainer did not reach a boundary; nothing was changed")
        time.sleep(0.2)


# --- commit, cancel -------------------------------------------------------------------------------------


def _commit(args: argparse.Namespace, plan: _Preflight, hold_id: str, boundary: int | None) -> int:
    """The proxy starts the new phase after ``boundary``; the trainer is released either way."""
    print(
        f"pivot: trainer holding after step {boundary}; starting the new phase in the proxy",
        file=sys.stderr,
    )
    result = ask(
        args.run_dir,
        "proxy",
        messages.PivotRequest(
            id=new_id(), policy_toml=plan.policy_toml, boundary_step=boundary, force=args.force
        ),
        timeout=30,
        retries=1,
    )
    released = _release(args, hold_id)
    if result is None or not result.ok:
        why = "no answer" if result is None else result.error
        raise _Failed(
            f"the proxy did not pivot ({why}); the trainer continues under the current policy"
        )
    if released is None or not released.ok:
        raise _Failed(
            f"the proxy pivoted but the trainer did not take the resume of hold {hold_id}; run "
            f"`andreactl pivot --policy {args.policy}` again to release it"
        )
    report = _pivot_report(result.data, dry_run=False)
    emit(
        args,
        report,
        f"pivot done: phase {report.phase} starts after step {boundary}; the ended phase is "
        f"archived in {report.archive}\n" + _bounds_text(report),
    )
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    """Release the trainer's hold without pivoting (the proxy may have pivoted already)."""
    trainer, proxy = _live(args)
    hold = trainer.hold
    if hold is None or hold.state is HoldState.FAILED:
        raise UserError("the trainer holds for no pivot; nothing to cancel")
    if hold.state is HoldState.PENDING and _other_client(args.run_dir):
        print(
            f"pivot: cancelling hold {hold.id} of a pivot still waiting for its boundary "
            f"(andreactl pid {hold.owner_pid} will report it)",
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
        "andreactl pivot --run-dir runs/r1 --cancel",
    ),
)
