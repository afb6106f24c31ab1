"""`andreactl`: the operator's client for an ANDREA run, with the conventions of systemctl and kubectl.

    andreactl COMMAND [--run-dir DIR] [--json | -o json] [options]

Global options go before or after the command; ``ANDREA_RUN_DIR`` stands in for ``--run-dir``. With
``--json`` (or ``-o json``) a command prints one JSON document on stdout, whose schema is its model in
:mod:`andrea.control.reports` (``andreactl schema COMMAND``), and everything meant for a person on stderr.

Commands live in one table, :data:`COMMANDS`: each is a :class:`Command` with its name, help line,
options, examples and a function ``(args, parser) -> exit code``. Adding one is writing those and adding
one row; ``main`` needs no change. A user error (a missing run directory, an unreadable file, a bad
value) is one ``andreactl: ...`` line and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from andrea.daemon.rundir import EVAL_FILE, LOSS_FILE, SAMPLES_FILE
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.status import Activity, HoldState, ProxyStatus, TrainerStatus

from . import reports as r
from . import verify_options

RUN_DIR_ENV = "ANDREA_RUN_DIR"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
#: What every command's exit code means; a command may add its own (status: 3).
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done"),
    (
        EXIT_FAILED,
        "the run refused or did not answer (daemon not running, request refused, check failed)",
    ),
    (
        EXIT_USAGE,
        "usage error: a bad option or value, a missing run directory or input file; nothing changed",
    ),
)


class UserError(Exception):
    """A mistake in the invocation or its inputs: printed as one line, exit code 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand of andreactl."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]
    #: Whether the command acts on a run and so needs the global --run-dir.
    needs_run_dir: bool = True
    examples: tuple[str, ...] = ()
    extra_exit_codes: tuple[tuple[int, str], ...] = ()


# --- talking to the daemons -----------------------------------------------------------------------------


def _ask(
    run_dir: Path, role: str, msg: object, timeout: float = 3.0, retries: int = 2
) -> object | None:
    """The daemon's reply, or None when it does not answer (not running, or wedged)."""
    from andrea.daemon.rundir import peer_endpoint
    from andrea.protocol.transport import Unreachable, request

    try:
        return request(peer_endpoint(run_dir, role), msg, timeout=timeout, retries=retries)  # type: ignore[arg-type]
    except Unreachable:
        return None


def _emit(args: argparse.Namespace, report: BaseModel, text: str) -> None:
    """The report as JSON (--json, -o json) or the text for a person, on stdout."""
    if args.json:
        print(report.model_dump_json(indent=1))
    else:
        print(text)


def _stamp(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


# --- status ---------------------------------------------------------------------------------------------


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def _status_report(run_dir: Path) -> r.StatusReport:
    """Live status from each daemon that holds its lock; an offline summary when the trainer does not
    run. A stopped daemon is known from its lock at once: no socket is touched, nothing created."""
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    from .offline import daemon_running, offline_summary

    running = {role: daemon_running(run_dir, role) for role in ("trainer", "proxy")}
    live: dict[str, dict | None] = {}
    for role, up in running.items():
        # A daemon that holds its lock runs: it answers within one round of its fair queue, even
        # among 100 clients polling as fast as it answers (0.24 s median, 0.74 s at most, measured
        # in docs/performance.md), so a loaded machine gets 3 s. Only a wedged daemon makes this
        # wait 2 × 3 s.
        reply = _ask(run_dir, role, m.StatusRequest(id=new_id()), timeout=3.0) if up else None
        live[role] = reply.data if reply is not None and reply.ok else None
    trainer = TrainerStatus.model_validate(live["trainer"]) if live["trainer"] else None
    proxy = ProxyStatus.model_validate(live["proxy"]) if live["proxy"] else None
    if trainer is not None:
        state = "running"
    elif not any(running.values()):
        state = "stopped"
    else:
        state = "partial"
    return r.StatusReport(
        time=r.utc_now(),
        run_dir=str(run_dir),
        state=state,
        trainer=trainer,
        proxy=proxy,
        offline=offline_summary(run_dir) if trainer is None else None,
    )


def _ago(seconds: float | None) -> str:
    from andrea.daemon.progress import format_duration

    return "-" if seconds is None else format_duration(seconds)


def _status_text(report: r.StatusReport, run_dir: Path) -> str:
    from andrea.daemon.progress import format_duration

    lines = []
    t = report.trainer
    if t is None:
        why = "holds its lock but does not answer" if report.state == "partial" else "not running"
        lines.append(f"trainer: {why}")
    else:
        loss = f"{t.loss_ema:.4f}" if t.loss_ema is not None else "-"
        done = t.step / t.max_steps if t.max_steps else 1.0
        activity = f"holding after step {t.step}" if t.activity is Activity.HOLDING else t.activity
        lines.append(
            f"trainer: {activity}, step {t.step:,}/{t.max_steps:,} ({done:.0%}), loss EMA {loss}"
            + (f", lr {t.lr:.2e}" if t.lr is not None else "")
            + (f", {t.tokens_per_second:,.0f} tok/s" if t.tokens_per_second else "")
        )
        lines.append(
            f"         elapsed {_ago(t.elapsed_seconds)}, ETA {_ago(t.eta_seconds)}, "
            + (
                f"last checkpoint {t.last_checkpoint} ({_ago(t.last_checkpoint_age_seconds)} ago)"
                if t.last_checkpoint
                else "no checkpoint yet"
            )
            + f", segment {t.segment}, pid {t.pid}"
            + (f", {t.device} {t.dtype}" if t.device else "")
        )
        if (h := t.hold) is not None:
            where = f"after step {h.step}" if h.step is not None else "until its next boundary"
            lines.append(
                f"         hold {h.id} ({h.state} {where}, {h.age_s:.0f} s, client pid "
                f"{h.owner_pid or '?'}): release with `andreactl pivot --policy FILE` or "
                "`andreactl pivot --cancel`"
            )
    p = report.proxy
    if p is None:
        lines.append(
            "proxy:   not running" if report.state != "partial" or t else "proxy:   not answering"
        )
    else:
        probs = ", ".join(f"{k} {v:.3f}" for k, v in p.probabilities.items())
        lines.append(
            f"proxy:   phase {p.phase} (after step {p.phase_start_step}, policy "
            f"{p.policy_fingerprint[:12]}), logged up to step {p.durable_step:,}"
        )
        lines.append(f"         probabilities: {probs}")
        for z in p.zombies:
            lines.append(f"         ZOMBIE arm {z.name!r}: {z.reason} (never draws)")
    evals = [d.last_eval for d in (t, p) if d is not None and d.last_eval is not None]
    if evals:
        lines.append("held-out: " + _eval_text(max(evals, key=lambda e: (e.step, e.segment))))
    elif t is not None and t.eval_every == 0:
        lines.append("held-out: not evaluated (no held-out split in this run, or eval.every = 0)")
    o = report.offline
    if o is not None:
        c = o.last_checkpoint
        lines.append(
            f"{run_dir}: stopped; last checkpoint "
            + (
                f"step {c.step:,} ({c.trigger}, {c.created.isoformat(timespec='seconds')}, "
                f"{format_duration(c.age_seconds)} ago)"
                if c
                else "none"
            )
        )
        if o.logged_step is not None:
            ema = "-" if o.loss_ema is None else f"{o.loss_ema:.4f}"
            lines.append(
                f"logged up to step {o.logged_step:,} (segment {o.segment}, phase {o.phase}), "
                f"loss EMA {ema}"
                + (f", policy {o.policy_fingerprint[:12]}" if o.policy_fingerprint else "")
            )
        if o.last_eval is not None:
            lines.append("held-out: " + _eval_text(o.last_eval))
    return "\n".join(lines)


def _eval_text(e: EvalEntry) -> str:
    """One evaluation record on one line."""
    arms = ", ".join(f"{n} {a.loss:.4f}" for n, a in e.arms.items())
    return (
        f"step {e.step}: mean {e.mean_loss():.4f}, worst {e.worst()[0]} ({arms}; {e.seconds:.2f} s)"
    )


def cmd_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """What the trainer and the proxy are doing; for a stopped run, a summary from its files."""
    report = _status_report(args.run_dir)
    _emit(args, report, _status_text(report, args.run_dir))
    return (
        EXIT_OK
        if report.state == "running"
        else EXIT_STOPPED
        if report.state == "stopped"
        else EXIT_FAILED
    )


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between updates")


def cmd_watch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Status every --interval seconds until Ctrl-C (with --json: one document per line)."""
    try:
        while True:
            report = _status_report(args.run_dir)
            if args.json:
                print(report.model_dump_json(), flush=True)
            else:
                stamp = report.time.astimezone().strftime("%Y-%m-%d %H:%M:%S")
                text = _status_text(report, args.run_dir).replace("\n", "\n" + " " * 22)
                print(f"[{stamp}] {text}", flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


# --- checkpoint, stop -----------------------------------------------------------------------------------


def _checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--boundary",
        action="store_true",
        help="at the next cadence boundary instead of the next step",
    )
    parser.add_argument("--wait", action="store_true", help="return once the checkpoint is durable")
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="with --wait: give up after this many seconds"
    )


def _stop_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait", action="store_true", help="return once the trainer has checkpointed and exited"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="with --wait: give up after this many seconds"
    )


def _send_trainer(args: argparse.Namespace, msg: object, wait: bool) -> int:
    from .offline import daemon_running

    if not daemon_running(args.run_dir, "trainer"):
        print(f"andreactl: the trainer of {args.run_dir} is not running", file=sys.stderr)
        return EXIT_FAILED
    # One long try for a waiting request: re-sending it would only coalesce, but a retry loop of
    # short timeouts would print nothing useful while a slow checkpoint is written.
    reply = _ask(
        args.run_dir,
        "trainer",
        msg,
        timeout=args.timeout if wait else 3.0,
        retries=1 if wait else 2,
    )
    if reply is None:
        print(
            f"andreactl: the trainer of {args.run_dir} does not answer (not running?)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    data = dict(reply.data or {})
    step = data.pop("step", None)
    checkpoint = data.pop("checkpoint", None)
    report = r.RequestReport(
        time=r.utc_now(),
        command=args.command,
        ok=reply.ok,
        step=step,
        checkpoint=checkpoint,
        detail=data,
        error=reply.error,
    )
    text = (
        "ok: " + ", ".join(f"{k} {v}" for k, v in (reply.data or {}).items())
        if reply.ok
        else f"error: {reply.error}"
    )
    _emit(args, report, text)
    return EXIT_OK if reply.ok else EXIT_FAILED


def cmd_checkpoint(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Ask the trainer for a checkpoint (an audit point, kept by retention)."""
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    return _send_trainer(
        args, m.CheckpointRequest(id=new_id(), boundary=args.boundary, wait=args.wait), args.wait
    )


def cmd_stop(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Ask the trainer to finish its step, checkpoint and exit."""
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    return _send_trainer(args, m.StopRequest(id=new_id(), wait=args.wait), args.wait)


# --- pivot ---------------------------------------------------------------------------------------------


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


def _fail(message: str) -> int:
    print(f"andreactl: {message}", file=sys.stderr)
    return EXIT_FAILED


def _pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pivot_report(data: dict, dry_run: bool) -> r.PivotReport:
    live = set(data.get("live_arms", []))
    return r.PivotReport(
        time=r.utc_now(),
        dry_run=dry_run,
        phase=data["phase"] + 1 if dry_run else data["phase"],
        boundary_step=data["boundary_step"],
        archive=None if dry_run else data.get("archive"),
        already=bool(data.get("already")),
        old_policy=data["old_policy"],
        new_policy=data["new_policy"],
        changes=data["changes"],
        bounds=[r.BoundsRow(**row, live=row["arm"] in live) for row in data["bounds"]],
    )


def _bounds_text(report: r.PivotReport) -> str:
    from andrea.daemon.mixing.policy import human

    rows = [f"{'arm':<16} {'floor':>16} {'cap':>16}"]
    for b in report.bounds:
        floor = f"{human(b.old_floor)} → {human(b.new_floor)}"
        cap = f"{human(b.old_cap)} → {human(b.new_cap)}"
        note = "" if b.live else "  (not live: ignored)"
        rows.append(f"{'*' if b.changed else ' '}{b.arm:<15} {floor:>16} {cap:>16}{note}")
    return "\n".join(rows)


def _next_boundary(trainer: TrainerStatus) -> int:
    every, step = trainer.checkpoint_every, trainer.step
    return step + 1 if every == 0 else (step // every + 1) * every


def _release(args: argparse.Namespace, hold_id: str) -> object | None:
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    return _ask(args.run_dir, "trainer", m.ResumeRequest(id=new_id(), hold_id=hold_id))


def _cancel(args: argparse.Namespace, trainer: TrainerStatus, proxy: ProxyStatus | None) -> int:
    hold = trainer.hold
    if hold is None or hold.state is HoldState.FAILED:
        raise UserError("the trainer holds for no pivot; nothing to cancel")
    if hold.state is HoldState.PENDING and _pid_alive(hold.owner_pid):
        print(
            f"pivot: cancelling hold {hold.id} of a pivot still waiting for its boundary "
            f"(andreactl pid {hold.owner_pid} will report it)",
            file=sys.stderr,
        )
    reply = _release(args, hold.id)
    if reply is None or not reply.ok:
        return _fail(f"the trainer did not release hold {hold.id}: {reply and reply.error}")
    pivoted = (
        proxy is not None
        and hold.step is not None
        and proxy.phase > 0
        and proxy.phase_start_step == hold.step
    )
    report = r.PivotCancelReport(
        time=r.utc_now(), hold_id=hold.id, outcome=reply.data["outcome"], pivoted=pivoted
    )
    _emit(
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


def cmd_pivot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The seed's polish pivot as one command: the trainer checkpoints at the next cadence boundary
    and holds; the proxy archives .samples.json and .state.json with the old policy and starts a
    fresh bandit under the new one; the trainer continues from exactly that step.

    Everything that can be checked is checked before the trainer is asked to hold (the policy, its
    arms and feasibility against the live arms, an unchanged policy); a refusal changes nothing
    (exit 2). Re-running after an interrupted pivot completes it; `--cancel` releases it."""
    from andrea.daemon.mixing.policy import PolicyError, load_policy
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    if not args.cancel:
        if args.policy is None:
            raise UserError("pivot needs --policy FILE (or --cancel)")
        try:
            load_policy(args.policy)
            text = args.policy.read_text(encoding="utf-8")
        except PolicyError as e:
            raise UserError(str(e)) from None
    status = _status_report(args.run_dir)
    trainer, proxy = status.trainer, status.proxy
    if trainer is None:
        return _fail("a pivot needs the trainer running and answering")
    if args.cancel:
        return _cancel(args, trainer, proxy)
    if proxy is None:
        return _fail("a pivot needs the proxy running and answering")
    if trainer.mixing != "proxy":
        return _fail("the trainer uses a fixed mixture; there is no bandit to pivot")

    hold = trainer.hold
    resuming = None
    if hold is not None and hold.state is not HoldState.FAILED:
        if _pid_alive(hold.owner_pid) and hold.owner_pid != os.getpid():
            return _fail(
                f"another pivot is in progress (hold {hold.id}, andreactl pid {hold.owner_pid}); "
                "wait for it, or cancel it with `andreactl pivot --cancel`"
            )
        resuming = hold
        print(
            f"pivot: completing an interrupted pivot (hold {hold.id}, {hold.state}"
            + (f" after step {hold.step}" if hold.step is not None else "")
            + ")",
            file=sys.stderr,
        )

    boundary = resuming.step if resuming is not None and resuming.step is not None else None
    check = _ask(
        args.run_dir,
        "proxy",
        m.PivotRequest(
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
        return _fail("the proxy did not answer the policy check; nothing was changed")
    if not check.ok and not (resuming is not None and check.data.get("kind") == "no-op"):
        raise UserError(f"pivot refused, nothing was changed: {check.error}")
    if args.dry_run:
        report = _pivot_report(check.data, dry_run=True)
        _emit(
            args,
            report,
            f"dry run: phase {report.phase - 1} (policy {report.old_policy[:12]}) would end and "
            f"phase {report.phase} (policy {report.new_policy[:12]}) start after step "
            f"{report.boundary_step} (the trainer's next checkpoint boundary; it is at step "
            f"{trainer.step})\n" + _bounds_text(report) + "\nnothing was changed",
        )
        return EXIT_OK

    if resuming is None:
        reply = _ask(
            args.run_dir,
            "trainer",
            m.CheckpointRequest(
                id=new_id(),
                boundary=True,
                hold=True,
                hold_owner_pid=os.getpid(),
                hold_timeout_s=args.hold_timeout,
            ),
        )
        if reply is None or not reply.ok:
            return _fail(
                f"the trainer did not accept the hold: {reply.error if reply else 'no answer'}"
            )
        hold_id = reply.data["hold_id"]
        print(
            f"pivot: the trainer will checkpoint at its next boundary and hold (hold {hold_id}, "
            f"now at step {trainer.step})",
            file=sys.stderr,
        )
    else:
        hold_id = resuming.id

    deadline = time.monotonic() + args.timeout
    last_answer = time.monotonic()
    # A status may be up to a moment older than the hold request (the trainer caches it under
    # load): the hold counts as gone only once it has been seen.
    seen = resuming is not None
    while True:
        t = _status_report(args.run_dir).trainer
        if t is not None:
            last_answer = time.monotonic()
        elif time.monotonic() - last_answer > 30:
            return _fail("the trainer stopped answering; nothing was changed")
        h = t.hold if t is not None else None
        seen = seen or (h is not None and h.id == hold_id)
        if h is not None and h.id == hold_id and h.state is HoldState.HOLDING and h.acknowledged:
            boundary = h.step
            break
        if seen and t is not None and (h is None or h.id != hold_id):
            return _fail(f"hold {hold_id} is gone (cancelled or timed out); nothing was changed")
        if h is not None and h.state is HoldState.FAILED:
            return _fail(f"the trainer could not hold: {h.error}; nothing was changed")
        if time.monotonic() > deadline or (t is not None and t.activity is Activity.STOPPING):
            _release(args, hold_id)
            return _fail("the trainer did not reach a boundary; nothing was changed")
        time.sleep(0.2)
    print(
        f"pivot: trainer holding after step {boundary}; starting the new phase in the proxy",
        file=sys.stderr,
    )
    result = _ask(
        args.run_dir,
        "proxy",
        m.PivotRequest(id=new_id(), policy_toml=text, boundary_step=boundary, force=args.force),
        timeout=30,
        retries=1,
    )
    released = _release(args, hold_id)
    if result is None or not result.ok:
        why = "no answer" if result is None else result.error
        return _fail(
            f"the proxy did not pivot ({why}); the trainer continues under the current policy"
        )
    if released is None or not released.ok:
        return _fail(
            f"the proxy pivoted but the trainer did not take the resume of hold {hold_id}; run "
            f"`andreactl pivot --policy {args.policy}` again to release it"
        )
    report = _pivot_report(result.data, dry_run=False)
    _emit(
        args,
        report,
        f"pivot done: phase {report.phase} starts after step {boundary}; the ended phase is "
        f"archived in {report.archive}\n" + _bounds_text(report),
    )
    return EXIT_OK


# --- checkpoints, prune ---------------------------------------------------------------------------------


def _checkpoints_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="check manifests and sizes only, without hashing every payload",
    )


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _inventory(args: argparse.Namespace, verify: bool) -> list:
    from andrea.daemon.checkpoint.catalog import inventory

    def progress(i: int, n: int, step: int) -> None:
        if verify and sys.stderr.isatty():
            print(f"\rverifying {i + 1}/{n} (step {step})…", end="", file=sys.stderr, flush=True)

    entries = inventory(args.run_dir, verify=verify, progress=progress)
    if verify and sys.stderr.isatty():
        print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    return entries


def _entry_row(e: object, now: datetime) -> str:
    note = " (pivot boundary)" if e.pivot_boundary else ""
    age = e.age_seconds(now)
    return f"{e.step:>10} {e.trigger:<9} {_human_bytes(e.bytes):>9} {_ago(age):>9}  {e.state}{note}"


def cmd_checkpoints(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Every checkpoint of the run: step, trigger, size, age and whether it verifies."""
    entries = _inventory(args, verify=not args.quick)
    now = r.utc_now()
    total = sum(e.bytes for e in entries)
    report = r.CheckpointsReport(
        time=now,
        checkpoints=[
            r.CheckpointRow(
                step=e.step,
                trigger=e.trigger,
                bytes=e.bytes,
                created=e.created_utc,
                state=e.state,
                intact=e.intact,
                pivot_boundary=e.pivot_boundary,
            )
            for e in entries
        ],
        total_bytes=total,
    )
    text = "\n".join(
        [f"{'step':>10} {'trigger':<9} {'size':>9} {'age':>9}  state"]
        + [_entry_row(e, now) for e in entries]
        + [f"{len(entries)} checkpoints, {_human_bytes(total)}"]
    )
    _emit(args, report, text)
    return EXIT_OK


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-latest",
        type=int,
        default=2,
        help="keep this many of the newest checkpoints, whatever their trigger (default 2)",
    )
    parser.add_argument(
        "--steps", help="remove only these steps (comma-separated) instead of all older ones"
    )
    parser.add_argument(
        "--include-boundaries", action="store_true", help="pivot boundaries may be removed too"
    )
    parser.add_argument(
        "--include-newest",
        action="store_true",
        help="the newest intact checkpoint (the resume point) may be removed too",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would go; remove nothing")


def cmd_prune(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Remove old checkpoints (audit points included), never the newest intact one or a pivot
    boundary unless told to. Damaged ones are left for inspection."""
    from andrea.daemon.checkpoint.catalog import plan_prune, prune

    if args.keep_latest < 0:
        raise UserError("--keep-latest must be >= 0")
    try:
        steps = {int(x) for x in args.steps.split(",")} if args.steps else None
    except ValueError:
        raise UserError(
            f"--steps takes step numbers separated by commas, not {args.steps!r}"
        ) from None
    entries = _inventory(args, verify=True)
    if steps is not None and (unknown := steps - {e.step for e in entries}):
        raise UserError(f"no checkpoint for step(s) {', '.join(map(str, sorted(unknown)))}")
    plan = plan_prune(
        entries, args.keep_latest, steps, args.include_boundaries, args.include_newest
    )
    now = r.utc_now()
    size = sum(e.bytes for e in plan.remove)
    freed = size if args.dry_run else prune(args.run_dir, plan)
    lines = ["would remove:" if args.dry_run else "removed:"]
    lines += [_entry_row(e, now) for e in plan.remove] or ["  nothing"]
    lines += ["kept:"] + [f"{s:>10}  {why}" for s, why in sorted(plan.keep.items(), reverse=True)]
    lines.append(f"{len(plan.remove)} checkpoints, {_human_bytes(freed)}")
    report = r.PruneReport(
        time=now,
        dry_run=args.dry_run,
        removed=[e.step for e in plan.remove],
        kept=plan.keep,
        bytes=freed,
    )
    _emit(args, report, "\n".join(lines))
    return EXIT_OK


# --- history, samples, plot, size ----------------------------------------------------------------------


def _last_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--last", type=int, default=20, help="how many of the newest steps (0: all)"
    )


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    _last_arguments(parser)
    parser.add_argument(
        "--eval",
        action="store_true",
        help="the held-out evaluations (.eval.json) instead of the training loss",
    )


def _eval_history(args: argparse.Namespace) -> int:
    from andrea.daemon.evallog import canonical_evals, read_evals

    path = args.run_dir / EVAL_FILE
    if not path.exists():
        print(
            f"andreactl: {path} does not exist yet (evaluations come every eval.every steps)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    evals = canonical_evals(read_evals(path))
    shown = evals[-args.last :] if args.last else evals
    names = list(dict.fromkeys(n for e in shown for n in e.arms))
    text = "\n".join(
        [f"{'step':>8} {'mean':>8} {'worst':<12}" + "".join(f" {n:>12}" for n in names) + " seg"]
        + [
            f"{e.step:>8} {e.mean_loss():>8.4f} {e.worst()[0]:<12}"
            + "".join(f" {e.arms[n].loss:>12.4f}" if n in e.arms else f" {'-':>12}" for n in names)
            + f" {e.segment:>3}"
            for e in shown
        ]
    )
    _emit(args, r.EvalHistoryReport(run_dir=str(args.run_dir), rows=shown), text)
    return EXIT_OK


def cmd_history(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The canonical loss curve (newest entry per step) from .loss.json, or with --eval the
    held-out evaluations from .eval.json."""
    if args.eval:
        return _eval_history(args)
    from andrea.daemon.evallog import last_eval
    from andrea.daemon.losslog import read_curve

    curve = read_curve(args.run_dir / LOSS_FILE)
    rows = range(len(curve))
    shown = [
        curve.entry(i) for i in (rows[-args.last :] if args.last else rows)
    ]  # models only for these
    text = "\n".join(
        [f"{'step':>8} {'loss':>9} {'lr':>9}  {'arm':<14} seg phase"]
        + [
            f"{e.step:>8} {e.loss:>9.4f} {e.lr:>9.2e}  {e.arm:<14} {e.segment:>3} {e.phase:>5}"
            for e in shown
        ]
    )
    report = r.HistoryReport(
        run_dir=str(args.run_dir),
        rows=[
            r.HistoryRow(
                **e.model_dump(
                    mode="json", include={"step", "loss", "lr", "arm", "tokens", "segment", "phase"}
                ),
                time=_stamp(e.wall_time),
            )
            for e in shown
        ],
    )
    if (args.run_dir / EVAL_FILE).exists() and (latest := last_eval(args.run_dir / EVAL_FILE)):
        text += "\nheld-out " + _eval_text(latest)
        text += " (andreactl history --eval for all)"
    _emit(args, report, text)
    return EXIT_OK


def cmd_samples(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The most recent generated samples, from .samples.json."""
    path = args.run_dir / SAMPLES_FILE
    if not path.exists():
        print(
            f"andreactl: {path} does not exist yet (samples come every sample_every steps)",
            file=sys.stderr,
        )
        return 1
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        records = data["records"][-args.last :] if args.last else data["records"]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{path}: not a samples file ({e})") from None
    text = "\n\n".join(
        f"step {rec['step']} (segment {rec['segment']}, phase {rec['phase']}, arms {rec['arm_mix']}):\n"
        + "\n".join(f"  {s['text']!r}" for s in rec["samples"])
        for rec in records
    )
    _emit(args, r.SamplesReport(run_dir=str(args.run_dir), records=records), text)
    return EXIT_OK


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, required=True, help="file to write: .png, .svg or .pdf (by extension)"
    )
    parser.add_argument("--since", type=int, help="first step shown (default: the first logged)")
    parser.add_argument("--until", type=int, help="last step shown (default: the last logged)")
    parser.add_argument("--title", help="title above the panels (default: the run directory)")
    parser.add_argument(
        "--dpi", type=int, default=110, help="pixels per inch of a PNG (the figure is 12 in wide)"
    )


def cmd_plot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The audit plot of the canonical curve: loss + EMA, arm shares with policy bands, LR, and marks
    for restarts, pivots, audit checkpoints and zombie arms (see andrea.control.plot)."""
    from andrea.control.plot import FORMATS, audit_figure, save_figure, select_steps
    from andrea.control.run_events import read_run_events
    from andrea.daemon.losslog import read_curve

    if args.out.suffix.lower().lstrip(".") not in FORMATS:
        parser.error(f"--out {args.out}: the extension must be one of .png, .svg, .pdf")
    curve = read_curve(args.run_dir / LOSS_FILE)
    if not curve:
        print("andreactl: .loss.json has no entries yet", file=sys.stderr)
        return 1
    events = read_run_events(args.run_dir, curve)
    evals = []
    if (args.run_dir / EVAL_FILE).exists():
        from andrea.daemon.evallog import canonical_evals, read_evals

        evals = canonical_evals(read_evals(args.run_dir / EVAL_FILE))
    for problem in events.problems:
        print(f"andreactl: warning: {problem}", file=sys.stderr)
    try:
        fig = audit_figure(
            curve,
            events,
            args.title or str(args.run_dir),
            since=args.since,
            until=args.until,
            evals=evals,
        )
    except ValueError as e:
        print(f"andreactl: {e}", file=sys.stderr)
        return 1
    save_figure(fig, args.out, args.dpi)
    shown = len(select_steps(curve, args.since, args.until))
    _emit(
        args,
        r.PlotReport(
            out=str(args.out),
            steps=shown,
            restarts=[s for s, _ in events.restarts],
            pivots=[p.step for p in events.pivots],
            audit_checkpoints=[s for s, _ in events.audit_checkpoints],
            zombies=[z.arm for z in events.zombies],
        ),
        f"wrote {args.out} ({shown} steps)",
    )
    return 0


def _metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=("export",), help="export: rebuild the metrics from .loss.json"
    )
    parser.add_argument(
        "--format",
        choices=("tensorboard", "csv", "jsonl"),
        required=True,
        help="tensorboard: an event-file directory; csv, jsonl: one row per step",
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="tensorboard: a new or empty directory; csv, jsonl: a new file",
    )


def cmd_metrics(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Rebuild the run's metrics (loss, EMA, LR, tokens/s, phase, segment, arm shares) from the
    canonical curve in .loss.json, for any run, past or running (see andrea.daemon.metrics)."""
    from andrea.daemon.losslog import read_curve
    from andrea.daemon.metrics import files

    out: Path = args.out
    if args.format == "tensorboard":
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            parser.error(f"--out {out}: must be a new or empty directory")
    elif out.exists():
        parser.error(f"--out {out}: already exists (nothing is overwritten)")
    curve = read_curve(args.run_dir / LOSS_FILE)
    if args.format == "tensorboard":
        from andrea.daemon.metrics.tensorboard import export_tensorboard

        def progress(done: int, total: int) -> None:
            print(f"metrics: {done:,}/{total:,} steps written", file=sys.stderr, flush=True)

        try:
            n = export_tensorboard(curve, out, progress)
        except ValueError as e:  # tensorboardX is not installed
            raise UserError(str(e)) from None
    else:
        n = (files.write_csv if args.format == "csv" else files.write_jsonl)(curve, out)
    _emit(
        args,
        r.MetricsReport(format=args.format, out=str(out), steps=n),
        f"wrote {n:,} steps as {args.format} to {out}",
    )
    return 0


def _size_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", required=True, help="andrea-tiny | andrea-12m | andrea-120m")


def cmd_size(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Parameter count and checkpoint size of a preset (8 + 12 bytes per parameter)."""
    import torch

    from andrea.daemon.checkpoint.format import payload_size
    from andrea.daemon.config import ConfigError, build_config
    from andrea.daemon.model import GPT

    try:
        cfg = build_config(overrides={"preset": args.preset})
    except ConfigError as e:
        parser.error(str(e))
    with torch.device("meta"):
        n = GPT(cfg.model).n_params()
    size = payload_size(n)
    _emit(
        args,
        r.SizeReport(preset=args.preset, n_params=n, checkpoint_bytes=size),
        f"{args.preset}: {n:,} parameters, checkpoint {size:,} bytes ({size / 1e6:.1f} MB)",
    )
    return 0


# --- export ---------------------------------------------------------------------------------------------


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--step", type=int, help="export this step (default: the newest intact checkpoint)"
    )
    parser.add_argument(
        "--to", type=Path, required=True, dest="dest", help="new or empty directory for the export"
    )
    parser.add_argument(
        "--safetensors",
        action="store_true",
        help="also write the weights as model.safetensors (needs the safetensors extra)",
    )


def cmd_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Export a verified checkpoint of the run (see andrea.control.export)."""
    # Imported here so that commands which do not need torch start fast.
    from andrea.control.export import run_export

    return run_export(args.run_dir, args.dest, args.step, args.json, args.safetensors)


# --- verify-resume --------------------------------------------------------------------------------------


def cmd_verify_resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the resume-verification protocol (see andrea.control.verify_resume)."""
    from andrea.control.verify_resume import run_problem
    from andrea.control.verify_resume.engine import REPORT_NAME

    if not args.json:
        return run_problem(parser, args)
    # The verifier prints its progress and table for a person: keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        code = run_problem(parser, args)
    report = args.output / REPORT_NAME
    if report.is_file():
        print(report.read_text(encoding="utf-8"))
    return code


def _schema_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        choices=sorted(r.REPORTS),
        metavar="COMMAND",
        help="one command (default: all)",
    )


def cmd_schema(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The JSON Schema of a command's --json output (all commands' without a name)."""
    names = [args.name] if args.name else sorted(r.REPORTS)
    schemas = {name: r.REPORTS[name].model_json_schema() for name in names}
    print(json.dumps(schemas[args.name] if args.name else schemas, indent=1))
    return EXIT_OK


#: Every subcommand, in the order `andreactl --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command(
        "status",
        "what the trainer and the proxy are doing (a stopped run: a summary from its files)",
        _no_arguments,
        cmd_status,
        examples=(
            "andreactl status --run-dir runs/r1",
            "ANDREA_RUN_DIR=runs/r1 andreactl status -o json",
        ),
        extra_exit_codes=((EXIT_STOPPED, "the run is stopped (the summary is from its files)"),),
    ),
    Command(
        "checkpoint",
        "checkpoint after the current step (or at the next boundary) and continue",
        _checkpoint_arguments,
        cmd_checkpoint,
        examples=("andreactl checkpoint --run-dir runs/r1 --wait",),
    ),
    Command(
        "stop",
        "finish the current step, checkpoint and exit",
        _stop_arguments,
        cmd_stop,
        examples=("andreactl stop --run-dir runs/r1 --wait",),
    ),
    Command(
        "pivot",
        "start a new bandit phase under a new policy at the next boundary",
        _pivot_arguments,
        cmd_pivot,
        examples=(
            "andreactl pivot --run-dir runs/r1 --policy polish.toml --dry-run",
            "andreactl pivot --run-dir runs/r1 --policy polish.toml",
            "andreactl pivot --run-dir runs/r1 --cancel",
        ),
    ),
    Command(
        "checkpoints",
        "every checkpoint: step, trigger, size, age, verified (pivot boundaries marked)",
        _checkpoints_arguments,
        cmd_checkpoints,
        examples=("andreactl checkpoints --run-dir runs/r1",),
    ),
    Command(
        "prune",
        "remove old checkpoints; never the newest intact one or a pivot boundary unless told",
        _prune_arguments,
        cmd_prune,
        examples=(
            "andreactl prune --run-dir runs/r1 --keep-latest 2 --dry-run",
            "andreactl prune --run-dir runs/r1 --steps 35,1200",
        ),
    ),
    Command(
        "history",
        "the canonical loss curve from .loss.json (--eval: the held-out evaluations)",
        _history_arguments,
        cmd_history,
        examples=(
            "andreactl history --run-dir runs/r1 --last 50",
            "andreactl history --run-dir runs/r1 -o json",
        ),
    ),
    Command(
        "samples",
        "the most recent generated samples",
        _last_arguments,
        cmd_samples,
        examples=("andreactl samples --run-dir runs/r1 --last 2",),
    ),
    Command(
        "watch",
        "status every few seconds until Ctrl-C",
        _watch_arguments,
        cmd_watch,
        examples=("andreactl watch --run-dir runs/r1 --interval 10",),
    ),
    Command(
        "plot",
        "the audit plot (loss, EMA, arm shares, LR, restarts, pivots) as PNG/SVG/PDF",
        _plot_arguments,
        cmd_plot,
        examples=(
            "andreactl plot --run-dir runs/r1 --out run.png",
            "andreactl plot --run-dir runs/r1 --out zoom.svg --since 100000 --until 120000",
        ),
    ),
    Command(
        "metrics",
        "export the run's metrics for TensorBoard, CSV or JSON Lines",
        _metrics_arguments,
        cmd_metrics,
        examples=(
            "andreactl metrics export --run-dir runs/r1 --format tensorboard --out tb/r1",
            "andreactl metrics export --run-dir runs/r1 --format csv --out r1.csv",
        ),
    ),
    Command(
        "size",
        "parameters and checkpoint bytes of a preset",
        _size_arguments,
        cmd_size,
        needs_run_dir=False,
        examples=("andreactl size --preset andrea-120m",),
    ),
    Command(
        "export",
        "a verified checkpoint with its config, metrics, load procedure and audit trail",
        _export_arguments,
        cmd_export,
        examples=(
            "andreactl export --run-dir runs/r1 --to exports/r1",
            "andreactl export --run-dir runs/r1 --step 110000 --to exports/r1-110k --safetensors",
        ),
    ),
    Command(
        "verify-resume",
        "prove with fresh processes that stop + resume reproduces the uninterrupted run",
        verify_options.add_arguments,
        cmd_verify_resume,
        needs_run_dir=False,
        examples=(
            "andreactl verify-resume --output /tmp/proof --problem mini",
            "andreactl verify-resume --output /tmp/proof --problem trainer --config run.toml",
            "andreactl verify-resume --output /tmp/proof --problem trainer --run-dir runs/r1",
        ),
    ),
    Command(
        "schema",
        "the JSON Schema of a command's --json output",
        _schema_arguments,
        cmd_schema,
        needs_run_dir=False,
        examples=("andreactl schema status",),
    ),
)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the epilog's layout and shows each option's default, when it has a meaningful one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default not in (None, False, argparse.SUPPRESS)
            and action.option_strings
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


def _epilog(command: Command | None) -> str:
    codes = EXIT_CODES + (command.extra_exit_codes if command else ())
    lines = ["exit codes:"] + [f"  {code}  {meaning}" for code, meaning in codes]
    examples = (
        command.examples
        if command
        else (
            "andreactl status --run-dir runs/r1",
            "andreactl plot --run-dir runs/r1 --out run.png",
            "andreactl COMMAND --help",
        )
    )
    lines += ["", "examples:"] + [f"  {e}" for e in examples]
    return "\n".join(lines)


def _add_global_options(parser: argparse.ArgumentParser, in_command: bool) -> None:
    # In a command's parser the defaults are SUPPRESS, so that a value given before the command
    # is not reset by the command's own copy of the option.
    unset = argparse.SUPPRESS if in_command else None
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--run-dir", type=Path, default=unset, help=f"the run directory (default: ${RUN_DIR_ENV})"
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if in_command else False,
        help="print the command's report as one JSON document on stdout (schema: andreactl schema)",
    )
    group.add_argument(
        "-o",
        dest="output_format",
        choices=("text", "json"),
        default=unset,
        help="output format; -o json is --json",
    )


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import PackageNotFoundError, version

    try:
        v = version("andrea")
    except PackageNotFoundError:
        v = "unknown"
    parser = argparse.ArgumentParser(
        prog="andreactl",
        description="Operate an ANDREA training run.",
        epilog=_epilog(None),
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"andreactl {v}")
    _add_global_options(parser, in_command=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            epilog=_epilog(command),
            formatter_class=_HelpFormatter,
        )
        command.add_arguments(sub)
        _add_global_options(sub, in_command=True)
        sub.set_defaults(command_entry=command, command_parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `andreactl` script; returns the exit code."""
    from andrea.daemon.losslog import LossLogError

    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command = args.command_entry
    sub: argparse.ArgumentParser = args.command_parser
    args.json = args.json or args.output_format == "json"
    if args.run_dir is None and os.environ.get(RUN_DIR_ENV):
        args.run_dir = Path(os.environ[RUN_DIR_ENV])
    if command.needs_run_dir:
        if args.run_dir is None:
            sub.error(f"{command.name} needs --run-dir DIR (or ${RUN_DIR_ENV})")
        if not args.run_dir.is_dir():
            print(f"andreactl: {args.run_dir}: no such run directory", file=sys.stderr)
            return EXIT_USAGE
    from andrea.daemon.rundir import SocketDirError

    try:
        return command.run(args, sub)
    except BrokenPipeError:
        # The reader went away (`andreactl history | head`): nothing to report, and nothing more
        # may be written to stdout, not even at interpreter exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except (UserError, LossLogError, SocketDirError, OSError) as e:
        # A person's mistake or an unreadable file: one line, no traceback.
        print(f"andreactl: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
