"""What every collaborator of one trainer life shares, built once before any of them
(factory.py): frozen, so that nothing in it is set later. Each collaborator (loop.py lists them)
takes it plus at most a few arguments of its own. Rank 0's control socket is not in it: a step,
which is arithmetic on the parts, must not reach a socket (pyproject.toml's import contracts).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from andrea.daemon.config import RunConfig
from andrea.daemon.data.encoding_progress import EncodingProgress
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.runtime.sdnotify import Notifier
from andrea.daemon.trainer.counters import Counters
from andrea.daemon.trainer.links.hold_registry import HoldRegistry
from andrea.daemon.trainer.options import TrainerOptions
from andrea.daemon.trainer.parts import Parts, Platform
from andrea.daemon.trainer.platform import distributed as dist
from andrea.protocol.status import TrainerStatus


@dataclass(frozen=True)
class TrainerContext:
    """One life's shared state: how it was started, where it computes, what it trains, where it
    stands, and the operator's requests."""

    opts: TrainerOptions
    platform: Platform
    parts: Parts
    counters: Counters
    notifier: Notifier
    #: The operator's requests (signals and control socket), taken at each agreement.
    flags: OperatorRequests
    #: The pivot's hold, shared with the control socket.
    holds: HoldRegistry
    #: The per-step agreement of every rank (a world of one agrees with itself).
    coord: dist.Coordinator
    #: The encoding of the arms while the context is built (status shows it).
    progress: EncodingProgress

    @property
    def cfg(self) -> RunConfig:
        return self.opts.cfg

    @property
    def world(self) -> dist.World:
        return self.opts.world

    @property
    def main(self) -> bool:
        """Global rank 0: the one that writes checkpoints and records and serves control."""
        return self.opts.world.is_main

    @property
    def run_dir(self) -> Path:
        return self.opts.run_dir


def starting_status(
    opts: TrainerOptions,
    platform: Platform,
    counters: Counters,
    holds: HoldRegistry,
    progress: EncodingProgress,
    started: float | None = None,
) -> TrainerStatus:
    """What `andreactl status` shows until the trainer is built (the built trainer's status adds
    what its collaborators know: the sink's link, evaluation, throughput). `started`: when the
    start-up began (monotonic), for the elapsed time."""
    c, cfg, world = counters, opts.cfg, opts.world
    return TrainerStatus(
        pid=os.getpid(),
        world_size=world.size,
        agent_pid=os.getppid() if world.distributed else None,
        activity=c.activity,
        step=c.step,
        max_steps=cfg.max_steps,
        loss_ema=c.loss_ema,
        last_checkpoint=c.last_saved or None,
        segment=c.segment,
        phase=c.phase,
        mixing=cfg.mixing,
        proxy_connected=None,
        preset=cfg.preset,
        run_dir=str(opts.run_dir),
        device=str(platform.device),
        dtype=platform.numerics.recorded,
        elapsed_seconds=None if started is None else time.monotonic() - started,
        checkpoint_every=cfg.checkpoint.every,
        hold=holds.describe(),
        grad_accum=cfg.grad_accum,
        lineage=c.lineage,
        preparing=progress.status(),
    )
