"""``andreactl checkpoint`` and ``stop``: one request to the running trainer, and its answer."""

from __future__ import annotations

import argparse
import sys

from andrea.protocol import messages as m
from andrea.protocol.transport import new_id

from .. import reports as r
from ..offline import daemon_running
from .conventions import EXIT_FAILED, EXIT_OK, Command, emit
from .daemons import ask


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


def _send_trainer(args: argparse.Namespace, msg: m.Message, wait: bool) -> int:
    if not daemon_running(args.run_dir, "trainer"):
        print(f"andreactl: the trainer of {args.run_dir} is not running", file=sys.stderr)
        return EXIT_FAILED
    # One long try for a waiting request: re-sending it would only coalesce, but a retry loop of
    # short timeouts would print nothing useful while a slow checkpoint is written.
    reply = ask(
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
    emit(args, report, text)
    return EXIT_OK if reply.ok else EXIT_FAILED


def cmd_checkpoint(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Ask the trainer for a checkpoint (an audit point, kept by retention)."""
    return _send_trainer(
        args, m.CheckpointRequest(id=new_id(), boundary=args.boundary, wait=args.wait), args.wait
    )


def cmd_stop(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Ask the trainer to finish its step, checkpoint and exit."""
    return _send_trainer(args, m.StopRequest(id=new_id(), wait=args.wait), args.wait)


CHECKPOINT = Command(
    "checkpoint",
    "checkpoint after the current step (or at the next boundary) and continue",
    _checkpoint_arguments,
    cmd_checkpoint,
    examples=("andreactl checkpoint --run-dir runs/r1 --wait",),
)
STOP = Command(
    "stop",
    "finish the current step, checkpoint and exit",
    _stop_arguments,
    cmd_stop,
    examples=("andreactl stop --run-dir runs/r1 --wait",),
)
