"""``andreactl checkpoint`` and ``stop``: one request to the running trainer, and its answer.

``stop`` behaves as ``systemctl stop``: on a stopped run there is nothing to do, and that is success
(exit 0). ``stop --wait`` returns once every process the stop ends has exited: the trainer, and the
proxy it started with ``--with-proxy`` (which the trainer stops after its final checkpoint).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from andrea.control import reports
from andrea.control.commands.conventions import (
    EXIT_FAILED,
    EXIT_GONE,
    EXIT_OK,
    Command,
    CommandFailed,
    ProcessGone,
    UserError,
    emit,
)
from andrea.control.commands.daemons import ask
from andrea.control.offline import daemon_running, lock_holder, process_running, run_processes
from andrea.daemon.rundir.layout import CONFIG_FILE, LOSS_FILE, is_run_dir
from andrea.protocol import messages
from andrea.protocol.transport import PeerGone, new_id

#: What exit code 4 of a waiting request means (--help and docs/andreactl.md).
GONE_MEANS = "with --wait: the trainer exited without answering (killed, or ended first)"


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
        "--wait",
        action="store_true",
        help="return once the trainer has checkpointed and every process of the run it ends "
        "(the trainer, its --with-proxy proxy) has exited",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="with --wait: give up after this many seconds"
    )


def _ask_trainer(
    args: argparse.Namespace, msg: messages.Message, wait: bool
) -> tuple[reports.RequestReport, str]:
    """The trainer's answer to ``msg`` as the command's report and text; CommandFailed when it does
    not answer."""
    # One long try for a waiting request: re-sending it would only coalesce, but a retry loop of
    # short timeouts would print nothing useful while a slow checkpoint is written.
    try:
        reply = ask(
            args.run_dir,
            "trainer",
            msg,
            timeout=args.timeout if wait else 3.0,
            retries=1 if wait else 2,
            alive=trainer_alive(args.run_dir) if wait else None,
        )
    except PeerGone:
        raise ProcessGone(
            f"the trainer of {args.run_dir} exited without answering (killed, or it ended "
            f"before it could): no {args.command} to confirm; its log (journalctl -u, or its "
            "stderr) says how it ended, and `andreactl status` what the run holds"
        ) from None
    if reply is None:
        raise CommandFailed(f"the trainer of {args.run_dir} does not answer (not running?)")
    data = dict(reply.data or {})
    step = data.pop("step", None)
    checkpoint = data.pop("checkpoint", None)
    report = reports.RequestReport(
        time=reports.utc_now(),
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
        else f"error: {_refusal(reply.error, reply.data)}"
    )
    return report, text


def trainer_alive(run_dir: Path) -> Callable[[], bool]:
    """Whether the trainer a request waits on still exists: the process holding the run's trainer
    lock now (released by the kernel however it ends), and, where the kernel names it, the same
    process as when the wait began (a unit's restart is another life, which never answers this
    request). Never judged by the pid written in the lock file, which a copy of the run carries."""
    first = lock_holder(run_dir, "trainer")

    def alive() -> bool:
        if not daemon_running(run_dir, "trainer"):
            return False
        return first is None or lock_holder(run_dir, "trainer") in (first, None)

    return alive


def _refusal(error: str | None, data: dict | None) -> str:
    """What a refusal says; a trainer too old to say why: its exit code."""
    if error:
        return error
    code = (data or {}).get("exit_code")
    return f"the trainer exited with code {code}; its log says why" if code else "refused"


def cmd_checkpoint(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Ask the trainer for a checkpoint (an audit point, kept by retention)."""
    if not daemon_running(args.run_dir, "trainer"):
        raise CommandFailed(f"the trainer of {args.run_dir} is not running")
    msg = messages.CheckpointRequest(id=new_id(), boundary=args.boundary, wait=args.wait)
    report, text = _ask_trainer(args, msg, args.wait)
    emit(args, report, text)
    return EXIT_OK if report.ok else EXIT_FAILED


def cmd_stop(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Ask the trainer to finish its step, checkpoint and exit; a stopped run is left as it is."""
    deadline = time.monotonic() + args.timeout
    if not daemon_running(args.run_dir, "trainer"):
        if not is_run_dir(args.run_dir):
            raise UserError(
                f"{args.run_dir} is not a run directory (no {CONFIG_FILE}, {LOSS_FILE} or "
                "checkpoint): there is no run to stop there"
            )
        report = reports.RequestReport(
            time=reports.utc_now(),
            command="stop",
            ok=True,
            step=None,
            checkpoint=None,
            detail={"already_stopped": True},
            error=None,
        )
        emit(args, report, f"the trainer of {args.run_dir} is not running; nothing to stop")
        return EXIT_OK
    # Known before the request: once the trainer exits, its lock no longer names it.
    processes = run_processes(args.run_dir) if args.wait else {}
    report, text = _ask_trainer(args, messages.StopRequest(id=new_id(), wait=args.wait), args.wait)
    if report.ok:
        _await_exit(processes, deadline)
    emit(args, report, text)
    return EXIT_OK if report.ok else EXIT_FAILED


def _await_exit(processes: dict[str, int], deadline: float) -> None:
    """Return once every process has exited; CommandFailed naming those still running at the
    deadline."""
    while running := {role: pid for role, pid in processes.items() if process_running(pid)}:
        if time.monotonic() > deadline:
            names = ", ".join(f"the {role} (pid {pid})" for role, pid in running.items())
            raise CommandFailed(f"the trainer checkpointed, but {names} had not exited in time")
        time.sleep(0.05)


CHECKPOINT = Command(
    "checkpoint",
    "checkpoint after the current step (or at the next boundary) and continue",
    _checkpoint_arguments,
    cmd_checkpoint,
    examples=("andreactl checkpoint --run-dir runs/r1 --wait",),
    extra_exit_codes=((EXIT_GONE, GONE_MEANS),),
)
STOP = Command(
    "stop",
    "finish the current step, checkpoint and exit (a stopped run: nothing to do, exit 0)",
    _stop_arguments,
    cmd_stop,
    examples=("andreactl stop --run-dir runs/r1 --wait",),
    extra_exit_codes=((EXIT_GONE, GONE_MEANS),),
)
