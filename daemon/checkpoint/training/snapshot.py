"""What a checkpoint holds: the state after the current step, staged for the writer, with every
rank's own states gathered at an agreed point. When and where it is written: checkpointer.py."""

from __future__ import annotations

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


def gather_ranks(ctx: TrainerContext) -> list[RankState] | None:
    """Every rank, at an agreed checkpoint point: check that the replicas agree, and gather each
    rank's RNG and cursor states to rank 0 (None on the other ranks and for a single process).
    DistributedError on every rank when the replicas diverged."""
    world, parts = ctx.world, ctx.parts
    if not world.distributed:
        return None
    m, v = parts.moments()
    dist.check_replicas(world, {"weights": parts.params, "m": m, "v": v})
    mine = RankState(
        rank=world.rank,
        rng=rngstate.capture(ctx.platform.device),
        data=[s.state_dict() for s in parts.streams],
    )
    got = dist.gather_bytes(world, mine.model_dump_json().encode())
    return [RankState.model_validate_json(b) for b in got] if got is not None else None


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

    def take(self, sink: RecordSink, ranks: list[RankState] | None = None) -> Snapshot:
        """The state after the current step. `ranks`: every rank's states, gathered by
        `gather_ranks` (rank 0 of a job). The caller makes sure no background write is still
        reading the buffer."""
        ctx = self.ctx
        states = ctx.parts.adam_states()
        adam_steps = {int(x) for x in torch.stack([s["step"] for s in states]).tolist()}  # one sync
        if len(adam_steps) != 1:
            raise RuntimeError(f"parameters disagree on Adam's step count: {sorted(adam_steps)}")
        step = ctx.counters.step
        m, v = ctx.parts.moments()
        payload = self.staging.fill(step, ctx.parts.params, m, v)
        if self._environment is None:
            self._environment = environment_of(ctx.platform, ctx.world, ctx.parts.compiled)
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
