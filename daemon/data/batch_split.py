"""How a step's batch is cut: over micro-batches (grad_accum) and over the job's ranks.

`batch_size` is defined once, by its field in daemon/config.py: the sequences of one optimizer
step over the whole job. A step trains `grad_accum` micro-batches of batch_size / grad_accum
sequences each; every rank draws the whole micro-batch (its chunk indices) from the arm's order
and trains its own contiguous batch_size / (world x grad_accum) of them. Runs created before that
reading (no `batch_size_per` in their run.toml) counted batch_size per micro-batch; they keep it,
so that they resume on the same batches.

Torch-free: `andreactl plan` uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from andrea.daemon.config import ConfigError, RunConfig, one_of


@dataclass(frozen=True)
class BatchShape:
    """The sequences of one optimizer step, as the job trains them."""

    #: Sequences per optimizer step over the whole job.
    per_step: int
    grad_accum: int
    world: int
    #: Tokens each sequence trains (the model's block_size).
    tokens_per_sequence: int

    @property
    def micro_batch(self) -> int:
        """Sequences per micro-batch over the whole job (what every rank draws from the order)."""
        return self.per_step // self.grad_accum

    @property
    def per_rank(self) -> int:
        """Sequences one rank trains per micro-batch."""
        return self.micro_batch // self.world

    @property
    def tokens_per_step(self) -> int:
        return self.per_step * self.tokens_per_sequence

    def describe(self) -> str:
        """One line for the start log: per step, per rank, per micro-batch, in sequences and tokens."""
        t, rank_step = self.tokens_per_sequence, self.per_rank * self.grad_accum
        ranks = "one rank" if self.world == 1 else f"each of {self.world} ranks"
        return (
            f"batch {self.per_step} sequences per step ({self.per_step * t:,} tokens) in "
            f"{self.grad_accum} micro-batch(es) of {self.micro_batch} ({self.micro_batch * t:,} "
            f"tokens); {ranks}: {rank_step} sequences per step ({rank_step * t:,} tokens), "
            f"{self.per_rank} per micro-batch ({self.per_rank * t:,} tokens)"
        )


def step_sequences(cfg: RunConfig) -> int:
    """Sequences per optimizer step over the whole job, under the reading of the run's config."""
    return cfg.batch_size if cfg.batch_size_per == "step" else cfg.batch_size * cfg.grad_accum


def batch_shape(cfg: RunConfig, world: int, existing: bool = False) -> BatchShape:
    """The batch of `cfg` on a job of `world` ranks. ConfigError naming both numbers and the sizes
    that would work when the ranks cannot share a micro-batch equally; for an `existing` run,
    whose batch_size its checkpoints fix, only the world sizes and grad_accum it can take."""
    per_step = step_sequences(cfg)
    shape = BatchShape(per_step, cfg.grad_accum, world, cfg.model.block_size)
    if shape.micro_batch % world:
        raise ConfigError(_existing_refusal(cfg, shape) if existing else _refusal(cfg, shape))
    return shape


def _existing_refusal(cfg: RunConfig, shape: BatchShape) -> str:
    """An existing run keeps its batch: the world sizes that share its micro-batch, and (where the
    config counts the batch per step, so that grad_accum only cuts it) the grad_accum values that
    let this world size share the same step."""
    micro, world, per_step = shape.micro_batch, shape.world, shape.per_step
    worlds = [w for w in range(1, micro + 1) if micro % w == 0]
    text = (
        f"this run's batch ({per_step} sequences per step in {shape.grad_accum} micro-batch(es) of "
        f"{micro}) cannot be shared equally by a job of {world} ranks: world sizes "
        f"{one_of(worlds)} would work"
    )
    if cfg.batch_size_per == "step":
        accums = [a for a in range(1, per_step + 1) if per_step % a == 0]
        fits = [a for a in accums if (per_step // a) % world == 0]
        if fits:
            text += (
                f", or grad_accum {one_of(fits)} at world size {world} (the same {per_step} "
                "sequences per step)"
            )
    return text + "; an existing run keeps its batch_size (its checkpoints are of that batch)"


def _refusal(cfg: RunConfig, shape: BatchShape) -> str:
    micro, world, accum = shape.micro_batch, shape.world, shape.grad_accum
    worlds = [w for w in range(1, micro + 1) if micro % w == 0]
    if cfg.batch_size_per == "step":
        unit = world * accum
        lower = cfg.batch_size // unit * unit
        sizes = [s for s in (lower, lower + unit) if s > 0]
        what = f"batch_size {cfg.batch_size} in {accum} micro-batch(es) is {micro} sequences each"
    else:
        lower = cfg.batch_size // world * world
        sizes = [s for s in (lower, lower + world) if s > 0]
        what = f"batch_size {cfg.batch_size} (sequences per micro-batch in this run)"
    return (
        f"{what}, which a job of {world} ranks cannot share equally: world sizes "
        f"{one_of(worlds)} would work with this batch, or batch_size {one_of(sizes)} at world "
        f"size {world}" + (f" (grad_accum {accum})" if accum > 1 else "")
    )
