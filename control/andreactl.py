"""`andreactl`: the operator's client for an ANDREA run.

    andreactl --run-dir DIR [--json] COMMAND [options]

Commands live in one table, :data:`COMMANDS`: each is a :class:`Command` with its name, help line,
options and a function ``(args) -> exit code``. Adding one (status, checkpoint, stop, pivot, history,
watch, ...) is writing those two functions and adding one row; ``main`` needs no change.

With ``--json`` a command prints one JSON document on stdout (its report) and everything meant for a
person on stderr, so that scripts can pipe it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from andrea.daemon.rundir import LOSS_FILE, SAMPLES_FILE
from andrea.protocol.status import Activity, ProxyStatus, TrainerStatus


@dataclass(frozen=True)
class Command:
    """One subcommand of andreactl."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]
    #: Whether the command acts on a run and so needs the global --run-dir.
    needs_run_dir: bool = True


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


def _emit(args: argparse.Namespace, data: object, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=1, default=str))
    else:
        print(text)


# --- status ---------------------------------------------------------------------------------------------


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


@dataclass(frozen=True)
class RunStatus:
    """What each daemon of a run answered; None for one that does not answer."""

    trainer: TrainerStatus | None
    proxy: ProxyStatus | None

    def answered(self) -> bool:
        return self.trainer is not None or self.proxy is not None

    def to_json(self) -> dict[str, object]:
        return {
            "trainer": self.trainer.model_dump(mode="json") if self.trainer else None,
            "proxy": self.proxy.model_dump(mode="json") if self.proxy else None,
        }


def _status_data(run_dir: Path) -> RunStatus:
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    replies = {}
    for role in ("trainer", "proxy"):
        reply = _ask(run_dir, role, m.StatusRequest(id=new_id()), timeout=1.5)
        replies[role] = reply.data if reply is not None and reply.ok else None
    return RunStatus(
        trainer=TrainerStatus.model_validate(replies["trainer"]) if replies["trainer"] else None,
        proxy=ProxyStatus.model_validate(replies["proxy"]) if replies["proxy"] else None,
    )


def _activity_text(t: TrainerStatus) -> str:
    if t.activity is Activity.HOLDING:
        return f"holding after step {t.step}"
    return str(t.activity)


def _status_text(data: RunStatus) -> str:
    lines = []
    t = data.trainer
    if t is None:
        lines.append("trainer: not running (no answer on its control socket)")
    else:
        loss = f"{t.loss_ema:.4f}" if t.loss_ema is not None else "-"
        lines.append(
            f"trainer: {_activity_text(t)}, step {t.step}/{t.max_steps}, loss EMA {loss}, "
            f"last checkpoint {t.last_checkpoint or 'none'}, segment {t.segment}, pid {t.pid}"
            + (f", {t.device} {t.dtype}" if t.device else "")
        )
    p = data.proxy
    if p is None:
        lines.append("proxy:   not running (no answer on its socket)")
    else:
        probs = ", ".join(f"{k} {v:.3f}" for k, v in p.probabilities.items())
        lines.append(
            f"proxy:   phase {p.phase} (from step {p.phase_start_step}), logged up to step {p.durable_step}"
        )
        lines.append(f"         probabilities: {probs}")
        for z in p.zombies:
            lines.append(f"         ZOMBIE arm {z.name!r}: {z.reason} (never draws)")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """What the trainer and the proxy are doing. Exit 1 when neither answers."""
    data = _status_data(args.run_dir)
    _emit(args, data.to_json(), _status_text(data))
    return 0 if data.answered() else 1


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between updates")


def cmd_watch(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Status every --interval seconds until Ctrl-C."""
    try:
        while True:
            data = _status_data(args.run_dir)
            stamp = time.strftime("%H:%M:%S")
            if args.json:
                print(json.dumps({"time": stamp, **data.to_json()}, default=str), flush=True)
            else:
                print(f"[{stamp}] " + _status_text(data).replace("\n", "\n           "), flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


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
    parser.add_argument("--timeout", type=float, default=3600.0)


def _send_trainer(args: argparse.Namespace, msg: object, wait: bool) -> int:
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
        return 1
    _emit(
        args,
        reply.model_dump(),
        (
            f"ok: {', '.join(f'{k} {v}' for k, v in reply.data.items())}"
            if reply.ok
            else f"error: {reply.error}"
        ),
    )
    return 0 if reply.ok else 1


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
    parser.add_argument(
        "--policy", type=Path, required=True, help="the new policy (caps and floors) as TOML"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="give up waiting for the boundary after this many seconds",
    )


def cmd_pivot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The seed's polish pivot as one command: the trainer checkpoints at the next cadence boundary
    and holds; the proxy archives .samples.json and .state.json with the old policy and starts a
    fresh bandit under the new one; the trainer continues from exactly that step."""
    from andrea.daemon.mixing.policy import PolicyError, load_policy
    from andrea.protocol import messages as m
    from andrea.protocol.transport import new_id

    try:
        load_policy(args.policy)
        text = args.policy.read_text(encoding="utf-8")
    except PolicyError as e:
        print(f"andreactl: {e}", file=sys.stderr)
        return 2
    status = _status_data(args.run_dir)
    trainer, proxy = status.trainer, status.proxy
    if trainer is None or proxy is None:
        print(
            "andreactl: a pivot needs the trainer and the proxy running and answering",
            file=sys.stderr,
        )
        return 1
    if trainer.mixing != "proxy":
        print(
            "andreactl: the trainer uses a fixed mixture; there is no bandit to pivot",
            file=sys.stderr,
        )
        return 1
    reply = _ask(
        args.run_dir, "trainer", m.CheckpointRequest(id=new_id(), boundary=True, hold=True)
    )
    if reply is None or not reply.ok:
        print(
            f"andreactl: the trainer did not accept the boundary checkpoint: {reply and reply.error}",
            file=sys.stderr,
        )
        return 1
    print(
        f"pivot: the trainer will checkpoint at its next boundary and hold (now at step {trainer.step})",
        file=sys.stderr,
    )
    deadline = time.monotonic() + args.timeout
    while True:
        t = _status_data(args.run_dir).trainer
        if t is not None and t.activity is Activity.HOLDING:
            boundary = t.step
            break
        if time.monotonic() > deadline or (t is not None and t.activity is Activity.STOPPING):
            print(
                "andreactl: the trainer did not reach a boundary; nothing was changed",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.2)
    print(
        f"pivot: trainer holding after step {boundary}; starting the new phase in the proxy",
        file=sys.stderr,
    )
    result = _ask(
        args.run_dir,
        "proxy",
        m.PivotRequest(id=new_id(), policy_toml=text, boundary_step=boundary),
        timeout=30,
        retries=1,
    )
    released = _ask(args.run_dir, "trainer", m.ResumeRequest(id=new_id()))
    if result is None or not result.ok:
        why = "no answer" if result is None else result.error
        print(
            f"andreactl: the proxy did not pivot ({why}); the trainer continues under the old policy",
            file=sys.stderr,
        )
        return 1
    if released is None:
        print(
            "andreactl: the proxy pivoted but the trainer did not answer the resume; run `andreactl checkpoint` "
            "or restart the trainer (it resumes from the boundary checkpoint)",
            file=sys.stderr,
        )
        return 1
    _emit(
        args,
        result.data,
        f"pivot done: phase {result.data['phase']} starts after step {boundary}; "
        f"the ended phase is archived in {result.data['archive']}",
    )
    return 0


# --- history, samples, plot, size ----------------------------------------------------------------------


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--last", type=int, default=20, help="how many of the newest steps (0: all)"
    )


def cmd_history(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The canonical loss curve (newest entry per step) from .loss.json."""
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
    _emit(args, [e.model_dump() for e in shown], text)
    return 0


def cmd_samples(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The most recent generated samples, from .samples.json."""
    path = args.run_dir / SAMPLES_FILE
    if not path.exists():
        print(
            f"andreactl: {path} does not exist yet (samples come every sample_every steps)",
            file=sys.stderr,
        )
        return 1
    data = json.loads(path.read_text())
    records = data["records"][-args.last :] if args.last else data["records"]
    text = "\n\n".join(
        f"step {r['step']} (segment {r['segment']}, phase {r['phase']}, arms {r['arm_mix']}):\n"
        + "\n".join(f"  {s['text']!r}" for s in r["samples"])
        for r in records
    )
    _emit(args, records, text)
    return 0


def _plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="SVG file to write")


def cmd_plot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The canonical loss curve as an SVG (no plotting library needed)."""
    from andrea.control.plot import loss_svg
    from andrea.daemon.losslog import read_curve

    curve = read_curve(args.run_dir / LOSS_FILE)
    if not curve:
        print("andreactl: .loss.json has no entries yet", file=sys.stderr)
        return 1
    args.out.write_text(loss_svg(curve.step, curve.loss, title=str(args.run_dir)))
    _emit(
        args, {"out": str(args.out), "steps": len(curve)}, f"wrote {args.out} ({len(curve)} steps)"
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
        {"preset": args.preset, "n_params": n, "checkpoint_bytes": size},
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


def cmd_export(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Export a verified checkpoint of the run (see andrea.control.export)."""
    # Imported here so that commands which do not need torch start fast.
    from andrea.control.export import run_export

    return run_export(args.run_dir, args.dest, args.step, args.json)


# --- verify-resume --------------------------------------------------------------------------------------


def _verify_resume_arguments(parser: argparse.ArgumentParser) -> None:
    # The same options as `python -m andrea.control.verify_resume`, declared here rather than imported:
    # building the parser must not import torch, or every andreactl command would pay seconds for it.
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="new directory for the paths and verification.json",
    )
    parser.add_argument("--problem", choices=("mini", "trainer"), default="mini")
    parser.add_argument(
        "--sabotage", help="break the full resume on purpose, so the verification must fail"
    )
    parser.add_argument(
        "--reuse", type=Path, help="earlier passed verification whose reference paths are reused"
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="the trainer's tokenized-corpus cache (trainer problem)"
    )


def cmd_verify_resume(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the resume-verification protocol (see andrea.control.verify_resume)."""
    from andrea.control.verify_resume import REPORT_NAME, run_problem

    if not args.json:
        return run_problem(parser, args)
    # The verifier prints its progress and table for a person: keep stdout for the report alone.
    with contextlib.redirect_stdout(sys.stderr):
        code = run_problem(parser, args)
    report = args.output / REPORT_NAME
    if report.is_file():
        print(report.read_text(encoding="utf-8"))
    return code


#: Every subcommand, in the order `andreactl --help` lists them.
COMMANDS: tuple[Command, ...] = (
    Command("status", "what the trainer and the proxy are doing", _no_arguments, cmd_status),
    Command(
        "checkpoint",
        "checkpoint after the current step (or at the next boundary) and continue",
        _checkpoint_arguments,
        cmd_checkpoint,
    ),
    Command("stop", "finish the current step, checkpoint and exit", _stop_arguments, cmd_stop),
    Command(
        "pivot",
        "start a new bandit phase under a new policy at the next boundary",
        _pivot_arguments,
        cmd_pivot,
    ),
    Command("history", "the canonical loss curve from .loss.json", _history_arguments, cmd_history),
    Command("samples", "the most recent generated samples", _history_arguments, cmd_samples),
    Command("watch", "status every few seconds until Ctrl-C", _watch_arguments, cmd_watch),
    Command("plot", "the loss curve as an SVG file", _plot_arguments, cmd_plot),
    Command(
        "size",
        "parameters and checkpoint bytes of a preset",
        _size_arguments,
        cmd_size,
        needs_run_dir=False,
    ),
    Command(
        "export",
        "copy a verified checkpoint with its config, metrics and load procedure",
        _export_arguments,
        cmd_export,
    ),
    Command(
        "verify-resume",
        "prove with fresh processes that stop + resume reproduces the uninterrupted run",
        _verify_resume_arguments,
        cmd_verify_resume,
        needs_run_dir=False,
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="andreactl", description="Operate an ANDREA training run."
    )
    parser.add_argument("--run-dir", type=Path, help="the run directory")
    parser.add_argument(
        "--json", action="store_true", help="print the command's report as JSON on stdout"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(command_entry=command, command_parser=sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `andreactl` script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command = args.command_entry
    if command.needs_run_dir and args.run_dir is None:
        parser.error(f"{command.name} needs --run-dir DIR")
    from andrea.daemon.rundir import SocketDirError

    try:
        return command.run(args, args.command_parser)
    except SocketDirError as e:
        print(f"andreactl: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
