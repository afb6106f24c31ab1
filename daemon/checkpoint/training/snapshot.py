"""What a checkpoint holds: the state after the current step, staged for the writer, with every
rank's own states gathered at an agreed point. When and where it is written: checkpointer.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from andrea.daemon.checkpoint import rngstate
from andrea.daemon.checkpoint.manager import Snapshot
from andrea.daemon.checkpoint.manifest import (
    DistributedState,
    Environment,
    MixingState,
    OptimizerState,
    Progress,
    RankState,
)
from andrea.daemon.checkpoint.writer import StagingBuffer
from andrea.daemon.optimizer import FUSED
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.platform import distributed as dist
from andrea.daemon.trainer.platform.environment import environment_of
from andrea.daemon.trainer.schedule import scheduler_state
from andrea.daemon.trainer.sink import RecordSink


@dataclass(frozen=True)
class Gathered:
    """What every rank contributed at an agreed checkpoint point, as rank 0 holds it."""

    #: Every rank's RNG and cursor states (rank 0 of a job; None elsewhere and alone).
    ranks: list[RankState] | None = None
    #: The step whose weights, m and v the strategy staged in rank 0's buffer itself (a sharded
    #: job); None: rank 0's own tensors are the job's, copied when the snapshot is taken.
    staged: int | None = None


def gather_ranks(
    ctx: TrainerContext, storage: Snapshotter | None, wait: Callable[[], None]
) -> Gathered:
    """Every rank, at an agreed checkpoint point: the job's model and optimizer state for rank 0
    (DDP checks that the replicas agree; FSDP streams the shards into rank 0's staging buffer,
    once `wait` saw a background write still reading it done), then each rank's RNG and cursor
    states, gathered to rank 0. `storage`: rank 0's snapshots (None elsewhere). DistributedError
    on every rank when DDP's replicas diverged."""
    world, parts = ctx.world, ctx.parts
    if not world.distributed:
        return Gathered()
    staging = storage.staging if storage is not None else None
    if staging is not None and parts.parallel.sharding != "replicated":
        wait()  # the buffer is about to be overwritten
    staged = parts.parallel.gather(
        parts.params,
        parts.moments(),
        [e.offset for e in parts.layout],
        staging,
        ctx.counters.step,
    )
    mine = RankState(
        rank=world.rank,
        rng=rngstate.capture(ctx.platform.device),
        data=[s.state_dict() for s in parts.streams],
    )
    got = dist.gather_bytes(world, mine.model_dump_json().encode())
    return Gathered(
        ranks=[RankState.model_validate_json(b) for b in got] if got is not None else None,
        staged=ctx.counters.step if staged else None,
    )


class Snapshotter:
    """Rank 0's copies of the current step into one preallocated host buffer (pinned on CUDA,
    where the copies are asynchronous and `Snapshot.ready` waits for them)."""

    def __init__(self, ctx: TrainerContext, backend: str | None) -> None:
        """`backend`: the job's process-group backend, recorded in its manifests."""
        self.ctx = ctx
        self.backend = backend
        n_params = sum(p.numel() for p in ctx.parts.params)
        self.staging = StagingBuffer(n_params, ctx.platform.device)
        #: Fixed for the life of the process: computed once, at the first checkpoint.
        self._environment: Environment | None = None

    def take(self, sink: RecordSink, gathered: Gathered | None = None) -> Snapshot:
        """The state after the current step. `gathered`: what `gather_ranks` brought (rank 0 of
        a job): every rank's states, and the weights and moments when a sharded job staged them.
        The caller makes sure no background write is still reading the buffer."""
        gathered = gathered or Gathered()
        ranks = gathered.ranks
        ctx = self.ctx
        states = ctx.parts.adam_states()
        adam_steps = {int(x) for x in torch.stack([s["step"] for s in states]).tolist()}  # one sync
        if len(adam_steps) != 1:
            raise RuntimeError(f"parameters disagree on Adam's step count: {sorted(adam_steps)}")
        step = ctx.counters.step
        if gathered.staged is not None:
            if gathered.staged != step:
                raise RuntimeError(f"staged the state of step {gathered.staged}, not of {step}")
            payload = self.staging.array
        else:
            m, v = ctx.parts.moments()
            payload = self.staging.fill(step, ctx.parts.params, m, v)
        if self._environment is None:
            self._environment = environment_of(
                ctx.platform, ctx.world, ctx.parts.compiled, ctx.parts.parallel.sharding
            )
        return Snapshot(
            step=step,
            fields=self._fields(sink, adam_steps.pop(), ranks, self._environment),
            payload=payload,
            ready=self.staging.ready,
        )

    def _fields(
        self,
        sink: RecordSink,
        adam_step: int,
        ranks: list[RankState] | None,
        environment: Environment,
    ) -> dict[str, object]:
        cfg, c, parts = self.ctx.cfg, self.ctx.counters, self.ctx.parts
        o = cfg.optim
        return dict(
            layout=parts.layout,
            # What the weights are; how the segment computed them is in `config`.
            model=cfg.model.arithmetic(),
            optimizer=OptimizerState(
                betas=(o.beta1, o.beta2),
                eps=o.eps,
                weight_decay=o.weight_decay,
                grad_clip=o.grad_clip,
                fused=FUSED,
                adam_step=adam_step,
            ),
            scheduler=scheduler_state(c.step, o),
            rng=ranks[0].rng if ranks else rngstate.capture(self.ctx.platform.device),
            data=[s.state_dict() for s in parts.streams],
            mixing=MixingState(mode=cfg.mixing, phase=c.phase, arms=[a.name for a in parts.arms]),
            pending_losses=sink.pending_losses(c.step),
            last_eval_step=c.last_eval_step,
            heldout=c.heldout if c.last_eval_step == c.step else None,
            pending_evals=sink.pending_evals(c.step),
            progress=Progress(
                step=c.step,
                tokens_seen=c.tokens_seen,
                segment=c.segment,
                train_seconds=c.train_seconds,
            ),
            environment=environment,
            config_hash=cfg.trajectory_hash(),
            config=cfg.model_dump(mode="json"),
            tokenizer=parts.tokenizer.identity,
            lineage=c.lineage,
            source_manifest=c.source_manifest,
            distributed=DistributedState(
                world_size=self.ctx.world.size, backend=self.backend or "?", ranks=ranks
            )
            if ranks
            else None,
        )
