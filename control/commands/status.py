"""``andreactl status`` and ``watch``: what the trainer and the proxy are doing, live from their
control sockets, or for a stopped run a summary from its files (:mod:`andrea.control.offline`)."""

from __future__ import annotations

import argparse
import signal
import time
import tomllib
from pathlib import Path
from typing import Literal

from andrea.control import reports
from andrea.control.commands.conventions import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    Command,
    emit,
    no_arguments,
)
from andrea.control.commands.daemons import ask
from andrea.control.commands.formatting import ago, eval_text, reward_lines
from andrea.control.offline import daemon_running, lock_holder, offline_summary, process_paused
from andrea.daemon.data.encoding_progress import describe as describe_preparation
from andrea.daemon.rundir.boundedio import read_bounded
from andrea.daemon.rundir.layout import CONFIG_FILE
from andrea.daemon.runtime.progress import format_duration
from andrea.protocol import messages
from andrea.protocol.status import Activity, ProxyStatus, TrainerStatus
from andrea.protocol.transport import new_id


def status_report(run_dir: Path) -> reports.StatusReport:
    """Live status from each daemon that holds its lock; an offline summary when the trainer does not
    run. A stopped daemon is known from its lock at once, a paused one (SIGSTOP) from its lock's
    holder: no socket is touched for either, nothing created."""
    daemons: dict[str, reports.DaemonLiveness] = {}
    live: dict[str, dict | None] = {}
    for role in ("trainer", "proxy"):
        daemons[role], live[role] = _liveness(run_dir, role)
    trainer = TrainerStatus.model_validate(live["trainer"]) if live["trainer"] else None
    proxy = ProxyStatus.model_validate(live["proxy"]) if live["proxy"] else None
    if trainer is not None:
        state = "running"
    elif all(d.state == "not running" for d in daemons.values()):
        state = "stopped"
    elif daemons["trainer"].state == "paused":
        state = "paused"
    else:
        state = "partial"
    return reports.StatusReport(
        time=reports.utc_now(),
        run_dir=str(run_dir),
        state=state,
        daemons=daemons,
        mixing=trainer.mixing if trainer is not None else _run_mixing(run_dir),
        trainer=trainer,
        proxy=proxy,
        offline=offline_summary(run_dir) if trainer is None else None,
    )


def _liveness(run_dir: Path, role: str) -> tuple[reports.DaemonLiveness, dict | None]:
    """What `role`'s lock and socket say, and its live status when it answers."""
    if not daemon_running(run_dir, role):
        return reports.DaemonLiveness(state="not running"), None
    pid = lock_holder(run_dir, role)
    if pid is not None and process_paused(pid):
        # Asking would only wait out 2 x 3 s: a stopped process reads nothing.
        return reports.DaemonLiveness(state="paused", pid=pid), None
    # A daemon that holds its lock runs: it answers within one round of its fair queue, even
    # among 100 clients polling as fast as it answers (0.24 s median, 0.74 s at most, measured
    # in docs/performance.md), so a loaded machine gets 3 s. Only a wedged daemon makes this
    # wait 2 x 3 s.
    reply = ask(run_dir, role, messages.StatusRequest(id=new_id()), timeout=3.0)
    if reply is not None and reply.ok:
        return reports.DaemonLiveness(state="answering", pid=pid), reply.data
    return reports.DaemonLiveness(state="not answering", pid=pid), None


def _run_mixing(run_dir: Path) -> Literal["fixed", "proxy"] | None:
    """The mixing run.toml records (fixed when it names none, as the config's default); None when
    it cannot be read."""
    try:
        mixing = tomllib.loads(read_bounded(run_dir / CONFIG_FILE, 1 << 20).decode()).get("mixing")
    except (OSError, ValueError):
        return None
    return "proxy" if mixing == "proxy" else "fixed" if mixing in (None, "fixed") else None


def _absent(report: reports.StatusReport, role: str) -> str | None:
    """Why `role` has no live status: its lock's state (`status_report`); None when the report
    does not say (one built elsewhere)."""
    d = report.daemons.get(role)
    if d is None:
        return None
    if d.state == "paused":
        return (
            f"paused (SIGSTOP, pid {d.pid}): holds its lock, but runs and answers nothing until "
            f"`kill -CONT {d.pid}`"
        )
    return "holds its lock but does not answer" if d.state == "not answering" else "not running"


def _trainer_lines(report: reports.StatusReport) -> list[str]:
    t = report.trainer
    if t is None:
        why = _absent(report, "trainer") or (
            "holds its lock but does not answer" if report.state == "partial" else "not running"
        )
        return [f"trainer: {why}"]
    loss = f"{t.loss_ema:.4f}" if t.loss_ema is not None else "-"
    done = t.step / t.max_steps if t.max_steps else 1.0
    activity = f"holding after step {t.step}" if t.activity is Activity.HOLDING else t.activity
    lines = [
        f"trainer: {activity}, step {t.step:,}/{t.max_steps:,} ({done:.0%}), loss EMA {loss}"
        + (f", lr {t.lr:.2e}" if t.lr is not None else "")
        + (f", {t.tokens_per_second:,.0f} tok/s" if t.tokens_per_second else ""),
        f"         elapsed {ago(t.elapsed_seconds)}, ETA {ago(t.eta_seconds)}, "
        + (
            f"last checkpoint {t.last_checkpoint} ({ago(t.last_checkpoint_age_seconds)} ago)"
            if t.last_checkpoint
            else "no checkpoint yet"
        )
        + f", segment {t.segment}, pid {t.pid}"
        + (f", {t.device} {t.dtype}" if t.device else ""),
    ]
    if t.lineage is not None and (t.lineage.init_from or len(t.lineage.world_sizes) > 1):
        lines.append(f"         lineage: {t.lineage.describe()}")
    if t.preparing is not None:
        lines.append(f"         data: {describe_preparation(t.preparing)}")
    if (h := t.hold) is not None:
        where = f"after step {h.step}" if h.step is not None else "until its next boundary"
        lines.append(
            f"         hold {h.id} ({h.state} {where}, {h.age_s:.0f} s, client pid "
            f"{h.owner_pid or '?'}): release with `andreactl pivot --policy FILE` or "
            "`andreactl pivot --cancel`"
        )
    return lines


def _proxy_lines(report: reports.StatusReport, explained: frozenset[str]) -> list[str]:
    p = report.proxy
    if p is None:
        why = _absent(report, "proxy")
        if why == "not running" and report.mixing == "fixed":
            return []  # a fixed mixture has no proxy to speak of
        if why is None:
            not_running = report.state != "partial" or report.trainer
            why = "not running" if not_running else "not answering"
        return [f"proxy:   {why}"]
    probs = ", ".join(f"{k} {v:.3f}" for k, v in p.probabilities.items())
    lines = [
        f"proxy:   phase {p.phase} (after step {p.phase_start_step}, policy "
        f"{p.policy_fingerprint[:12]}), logged up to step {p.durable_step:,}",
        f"         probabilities: {probs}",
    ]
    lines += [f"         ZOMBIE arm {z.name!r}: {z.reason} (never draws)" for z in p.zombies]
    if p.reward is not None:
        zombies = frozenset(z.name for z in p.zombies)
        lines += [
            "         " + line for line in reward_lines(p.reward, zombies, explained=explained)
        ]
    return lines


def _live_eval_lines(report: reports.StatusReport) -> list[str]:
    t, p = report.trainer, report.proxy
    evals = [d.last_eval for d in (t, p) if d is not None and d.last_eval is not None]
    if evals:
        return ["held-out: " + eval_text(max(evals, key=lambda e: (e.step, e.segment)))]
    if t is not None and t.eval_every == 0:
        return ["held-out: not evaluated (no held-out split in this run, or eval.every = 0)"]
    return []


def _offline_lines(
    report: reports.StatusReport, run_dir: Path, explained: frozenset[str]
) -> list[str]:
    o = report.offline
    if o is None:
        return []
    c = o.last_checkpoint
    held = report.daemons.get("trainer")
    # Not "stopped" while a trainer holds the run's lock: a paused one resumes with SIGCONT.
    said = "stopped" if held is None or held.state == "not running" else "from its files"
    lines = [
        f"{run_dir}: {said}; last checkpoint "
        + (
            f"step {c.step:,} ({c.trigger}, {c.created.isoformat(timespec='seconds')}, "
            f"{format_duration(c.age_seconds)} ago)"
            if c
            else "none"
        )
    ]
    if o.logged_step is not None:
        ema = "-" if o.loss_ema is None else f"{o.loss_ema:.4f}"
        lines.append(
            f"logged up to step {o.logged_step:,} (segment {o.segment}, phase {o.phase}), "
            f"loss EMA {ema}"
            + (f", policy {o.policy_fingerprint[:12]}" if o.policy_fingerprint else "")
        )
    if o.reward is not None and report.proxy is None:
        lines += reward_lines(
            o.reward, source="as the proxy last wrote .state.json", explained=explained
        )
    if o.last_eval is not None:
        lines.append("held-out: " + eval_text(o.last_eval))
    if o.lineage is not None and (o.lineage.init_from or len(o.lineage.world_sizes) > 1):
        lines.append(f"lineage: {o.lineage.describe()}")
    lines += [f"unreadable: {problem}" for problem in o.problems]
    return lines


def status_text(
    report: reports.StatusReport, run_dir: Path, explained: frozenset[str] = frozenset()
) -> str:
    """The status report for a person: the trainer, the proxy, the newest held-out evaluation and,
    for a stopped run, what its files say. `explained`: what the reward means, where a refresh
    has said it already (`watch`)."""
    return "\n".join(
        _trainer_lines(report)
        + _proxy_lines(report, explained)
        + _live_eval_lines(report)
        + _offline_lines(report, run_dir, explained)
    )


def reward_meaning(report: reports.StatusReport) -> str | None:
    """What the reward in a status report means, live or as the proxy last wrote it."""
    if report.proxy is not None and report.proxy.reward is not None:
        return report.proxy.reward.meaning
    if report.offline is not None and report.offline.reward is not None:
        return report.offline.reward.meaning
    return None


def cmd_status(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """What the trainer and the proxy are doing; for a stopped run, a summary from its files."""
    report = status_report(args.run_dir)
    emit(args, report, status_text(report, args.run_dir))
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
    # SIGINT is the only way this loop ends, so it must be heard even where it was inherited as
    # ignored (a background job of a non-interactive shell starts so): `kill -INT` stops it too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    said: frozenset[str] = frozenset()  # the reward's meaning: said once, and again on a change
    try:
        while True:
            report = status_report(args.run_dir)
            if args.json:
                print(report.model_dump_json(), flush=True)
            else:
                stamp = report.time.astimezone().strftime("%Y-%m-%d %H:%M:%S")
                text = status_text(report, args.run_dir, said).replace("\n", "\n" + " " * 22)
                print(f"[{stamp}] {text}", flush=True)
                meaning = reward_meaning(report)
                said = frozenset({meaning}) if meaning else said
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


STATUS = Command(
    "status",
    "what the trainer and the proxy are doing (a stopped run: a summary from its files)",
    no_arguments,
    cmd_status,
    examples=(
        "andreactl status --run-dir runs/r1",
        "ANDREA_RUN_DIR=runs/r1 andreactl status -o json",
    ),
    extra_exit_codes=((EXIT_STOPPED, "the run is stopped (the summary is from its files)"),),
)
WATCH = Command(
    "watch",
    "status every few seconds until Ctrl-C",
    _watch_arguments,
    cmd_watch,
    examples=("andreactl watch --run-dir runs/r1 --interval 10",),
)
