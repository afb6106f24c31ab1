"""The trainer, built in one pass: first the context every collaborator shares (`open_context`),
then, once every rank of a job has agreed that its start-up went well, each collaborator in turn,
from the checkpoint the life resumes from (`build_trainer`). Nothing is set after it is built.

The two steps are apart for one reason: a rank that fails to load its data (or is stopped while it
does) must tell the others before any of them waits in the resume's broadcast (`_agree_on_start`
in service/cli.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from typing import IO

import torch

from andrea.daemon.checkpoint.training.checkpointer import Checkpointer, Storage
from andrea.daemon.checkpoint.training.restore import Restorer
from andrea.daemon.data.encoding_progress import EncodingProgress, describe
from andrea.daemon.rundir.layout import bind_endpoint, claim
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.runtime.sdnotify import Notifier
from andrea.daemon.trainer.context import TrainerContext, starting_status
from andrea.daemon.trainer.counters import Counters
from andrea.daemon.trainer.evaluation import Evaluation, plan_evaluation
from andrea.daemon.trainer.links.control_server import ControlServer
from andrea.daemon.trainer.links.hold_registry import HoldRegistry
from andrea.daemon.trainer.loop import Collaborators, Trainer
from andrea.daemon.trainer.options import TrainerOptions
from andrea.daemon.trainer.parts import build_parts, resolve_platform, wrap_for_training
from andrea.daemon.trainer.phase_follower import PhaseFollower
from andrea.daemon.trainer.platform import distributed as dist
from andrea.daemon.trainer.reporting import Reporter
from andrea.daemon.trainer.sink import open_sink
from andrea.daemon.trainer.step import StepRunner


@dataclass(frozen=True)
class Opened:
    """A life's context, with rank 0's run-directory lock and control socket (None elsewhere)."""

    ctx: TrainerContext
    control: ControlServer | None
    lock: IO[bytes] | None


def open_context(
    opts: TrainerOptions,
    flags: OperatorRequests,
    device: torch.device | None = None,
    notifier: Notifier | None = None,
    *,
    lock: IO[bytes] | None = None,
) -> Opened:
    """Resolve the platform on `device` (default: the config's); on rank 0 claim the run directory
    (unless `lock` holds its trainer lock already) and bind the control socket, which answers
    status from then on (the data's preparation included); then load the data and build the model
    and optimizer. Raises InterruptedError (a stop during start-up), DataError, AlreadyRunning, or
    OSError/ZMQError (the run directory's)."""
    world = opts.world
    notifier = notifier or Notifier(enabled=world.is_main)
    platform = resolve_platform(opts.cfg, device)
    # Each sign of an encoding's progress keeps systemd waiting for READY=1 (a first start on a
    # large corpus outlasts any TimeoutStartSec), with the progress line as the unit's status.
    progress = EncodingProgress(on_advance=lambda p: notifier.preparing(describe(p)))
    counters, holds = Counters(), HoldRegistry()
    control: ControlServer | None = None
    if world.is_main:
        lock = lock or claim(opts.run_dir, "trainer")
        status = partial(
            starting_status, opts, platform, counters, holds, progress, time.monotonic()
        )
        control = ControlServer(bind_endpoint(opts.run_dir, "trainer"), flags, status, holds)
    notifier.preparing("starting: preparing the data (verifying, or encoding, the arms)")
    try:
        parts = build_parts(opts.cfg, platform, world, opts.run_dir, flags.stop_requested, progress)
    except BaseException as e:
        if control is not None:  # a client waiting on a stop or checkpoint hears how it ended
            control.abandon(*_ended_before_training(e))
        raise
    notifier.preparing("starting: the data is ready; building the model and resuming")
    coord = dist.Coordinator(world, enabled=opts.coordinate, arms=len(parts.arms))
    ctx = TrainerContext(opts, platform, parts, counters, notifier, flags, holds, coord, progress)
    return Opened(ctx, control, lock)


def _ended_before_training(e: BaseException) -> tuple[int | None, str]:
    """The exit code (None: the caller's mapping decides it) and reason the control socket's
    waiting clients hear when the start ends while the data is prepared."""
    if isinstance(e, InterruptedError):
        return (
            ExitCode.OK,
            "stopped during start-up (while preparing the data); nothing was trained",
        )
    return None, f"the start failed while preparing the data ({e}); the trainer's log says more"


def build_trainer(opened: Opened, backend: str | None = None) -> Trainer:
    """Every collaborator, once, from the context: rank 0 finds the newest valid checkpoint and
    every rank restores it (weights, m and v from rank 0, its own cursors from the manifest); the
    job's strategy wraps the model; the records' sink opens (the proxy link or the loss log). `backend`: the
    job's process-group backend, recorded in its manifests. Raises ResumeRefused on every rank
    when rank 0 refuses, SourceError for an unusable --init-from, RecordLogRefused."""
    ctx, control = opened.ctx, opened.control
    storage = Storage.of(ctx, control, backend)
    restorer = Restorer(ctx, storage.manager if storage is not None else None)
    manifest, config_changed = restorer.resume()
    skip = ctx.opts.skip_restore
    restored = restorer.moments_restored
    wrap_for_training(ctx.parts, restored, "buckets" not in skip)
    ctx.counters.phase = manifest.mixing.phase if manifest is not None else 0
    plan = plan_evaluation(ctx, manifest)
    sink = open_sink(ctx, manifest)
    checkpointer = Checkpointer(ctx, storage, sink, config_changed)
    stepper = StepRunner(ctx, checkpointer.grace_seconds, checkpointer.before_update)
    evaluation = Evaluation(ctx, plan, sink)
    reporter = Reporter(ctx, sink)
    pivots = PhaseFollower(ctx, sink, checkpointer, restorer, reporter)
    reporter.describe_start()
    collaborators = Collaborators(
        restorer, sink, checkpointer, stepper, evaluation, reporter, pivots, control, opened.lock
    )
    trainer = Trainer(ctx, collaborators)
    if control is not None:
        control.serve_status(trainer.status)
    return trainer


def assemble(
    opts: TrainerOptions,
    flags: OperatorRequests,
    device: torch.device | None = None,
    backend: str | None = None,
) -> Trainer:
    """Both steps at once, for a single process (benchmarks, tests): nothing to agree between."""
    return build_trainer(open_context(opts, flags, device), backend)
