"""What a run trains with: the platform (device, numerics, determinism), the data streams, the
model and its optimizer.

They are built in the order that fixes a fresh run's random draws: the global generators are
seeded from the config just before the model is built, and the ranks other than 0 of a job reseed
their own streams after it. A resumed run overwrites all of it from the manifest.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch

from andrea.daemon.checkpoint.manager import layout_of
from andrea.daemon.checkpoint.manifest import LayoutEntry
from andrea.daemon.config import OptimConfig, RunConfig
from andrea.daemon.data.arms import Arm, ArmStream, FixedMixture, load_arms
from andrea.daemon.data.batch_split import BatchShape, batch_shape
from andrea.daemon.data.encoding_progress import EncodingProgress
from andrea.daemon.data.tokenizer import RunTokenizer, load_tokenizer
from andrea.daemon.model import GPT
from andrea.daemon.optimizer import AdamW
from andrea.daemon.trainer.parallel import Strategy, strategy_for
from andrea.daemon.trainer.platform import determinism
from andrea.daemon.trainer.platform import distributed as dist
from andrea.daemon.trainer.platform.precision import NumericMode, resolve_device
from andrea.daemon.trainer.platform.precision import resolve as resolve_precision


@dataclass(frozen=True)
class Platform:
    """Where and how the arithmetic runs, resolved from the config and applied to the process."""

    device: torch.device
    deterministic: bool
    numerics: NumericMode


def resolve_platform(cfg: RunConfig, device: torch.device | None = None) -> Platform:
    """Apply the config's threads, determinism and precision on `device` (default: the config's)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = device if device is not None else resolve_device(cfg.device)
    deterministic = determinism.resolve(cfg.deterministic, device)
    determinism.apply(deterministic)
    numerics = resolve_precision(cfg.precision, device)
    numerics.apply()
    return Platform(device, deterministic, numerics)


@dataclass
class Parts:
    """The data, the model and the optimizer of one rank."""

    #: What the arms' text was encoded with, and what samples are decoded with.
    tokenizer: RunTokenizer
    arms: list[Arm]
    streams: list[ArmStream]
    mixture: FixedMixture
    arm_index: dict[str, int]
    #: How each step's batch is cut over micro-batches and ranks.
    batch: BatchShape
    model: GPT
    #: What a step calls: the model, or the strategy's wrapper of it (compiled when configured).
    forward: torch.nn.Module
    params: list[torch.nn.Parameter]
    layout: list[LayoutEntry]
    optimizer: AdamW
    compiled: bool
    #: How the job's ranks share the model (daemon/trainer/parallel/): wrap, sync, clip, gather.
    parallel: Strategy
    #: The optimizer's settings, for a strategy that builds it again over its own parameters.
    optim: OptimConfig

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch over the whole job: what every rank draws from the order."""
        return self.batch.micro_batch

    @property
    def local_batch(self) -> int:
        """Sequences per micro-batch on this rank."""
        return self.batch.per_rank

    def adam_states(self) -> list[dict[str, torch.Tensor]]:
        """AdamW's per-parameter state, in parameter order (empty dicts before the first step)."""
        return [self.optimizer.state[p] for p in self.params]

    def moments(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Adam's first and second moments (m, v), in parameter order."""
        states = self.adam_states()
        return [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]


def adamw(model: GPT, optim: OptimConfig) -> AdamW:
    """The run's optimizer: AdamW over the model's weight-decay groups, with the config's settings."""
    return AdamW(
        model.decay_groups(optim.weight_decay),
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
    )


def build_parts(
    cfg: RunConfig,
    platform: Platform,
    world: dist.World,
    run_dir: Path,
    stop_requested: Callable[[], bool],
    progress: EncodingProgress | None = None,
) -> Parts:
    """Load the data (InterruptedError when a stop comes meanwhile, DataError; an encoding's
    progress reported to `progress`), then build the model and its optimizer, seeded for a fresh
    run."""
    shape = batch_shape(cfg, world.size)
    tokenizer = load_tokenizer(cfg.data.tokenizer, run_dir)
    arms = load_arms(cfg.data, run_dir, cfg.model.vocab_size, stop_requested, tokenizer, progress)
    shifted = cfg.data.windows == "shifted"
    streams = [ArmStream(a, cfg.seed, cfg.model.block_size, shifted) for a in arms]
    mixture = FixedMixture([a.name for a in arms], [s.weight for s in cfg.data.arms], cfg.seed)
    model = _seeded_model(cfg, platform.device, world.rank)
    optimizer = adamw(model, cfg.optim)
    return Parts(
        tokenizer=tokenizer,
        arms=arms,
        streams=streams,
        mixture=mixture,
        arm_index={a.name: i for i, a in enumerate(arms)},
        batch=shape,
        model=model,
        forward=model,
        params=[p for _, p in model.named_parameters()],
        layout=layout_of((n, tuple(p.shape)) for n, p in model.named_parameters()),
        optimizer=optimizer,
        compiled=cfg.compile == "on" or (cfg.compile == "auto" and platform.device.type == "cuda"),
        parallel=strategy_for(cfg.distributed.strategy, world, platform.device, platform.numerics),
        optim=cfg.optim,
    )


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def seed_rank_stream(seed: int, rank: int, step: int) -> None:
    """A rank's random streams when its checkpoint holds none for it (it resumes a smaller job's
    run): a pure function of (seed, rank, step), so the same resume draws the same again."""
    _seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0]))


def _seeded_model(cfg: RunConfig, device: torch.device, rank: int) -> GPT:
    # Seed everything for a fresh run; a resumed run overwrites all of it from the manifest.
    _seed(cfg.seed)
    model = GPT(cfg.model).to(device)
    if rank:
        # Same initial weights everywhere (DDP also broadcasts rank 0's), but each rank's own
        # random stream afterwards: identical dropout masks on every rank would waste the data.
        _seed(int(np.random.SeedSequence([cfg.seed, rank]).generate_state(1)[0]))
    return model


def wrap_for_training(parts: Parts, restored: bool, finalize_buckets: bool = True) -> None:
    """After a resume (`restored`: Adam's moments came from a checkpoint, on rank 0), the job's
    strategy wraps the model and brings rank 0's state to every rank (DDP broadcasts it, FSDP
    scatters it into shards; `finalize_buckets` False only for DDP's negative control); then the
    compiler, when configured."""
    optim = parts.optim
    wrapped = parts.parallel.wrap(
        parts.model, parts.optimizer, restored, lambda m: adamw(m, optim), finalize_buckets
    )
    parts.forward, parts.params, parts.optimizer = (
        wrapped.forward,
        wrapped.params,
        wrapped.optimizer,
    )
    if parts.compiled:
        # Evaluation and sampling run the plain model (eval mode would only add a second
        # compiled graph); the compiled module shares its parameters.
        # A compiled Module is a Module (torch's OptimizedModule); the stubs say only Callable.
        parts.forward = cast(torch.nn.Module, torch.compile(parts.forward))
