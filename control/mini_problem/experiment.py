"""The experiment: data, model, optimizer, scheduler, the three generators, and one training run
(fresh, or resumed from a checkpoint in the seed's restore order)."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from andrea.control.mini_problem.schema import (
    PEEKED_DRAWS,
    LoadedCheckpoint,
    MiniConfig,
    NextDraws,
    StepRecord,
)
from andrea.control.verify_options import (
    SCHEDULER_AFTER_OPTIMIZER,
    SKIP_DATA_CURSOR,
    SKIP_NUMPY_RNG,
    SKIP_OPTIMIZER_STATE,
)

log = logging.getLogger(__name__)


@dataclass
class LiveRun:
    """The live training state of one process."""

    config: MiniConfig
    x: torch.Tensor
    y: torch.Tensor
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    generator: np.random.Generator
    step: int
    epoch: int
    cursor: int
    permutation: list[int]
    history: list[StepRecord]


def configure_torch(config: MiniConfig) -> None:
    """Fix the numerics the proof is stated for: float64 and a fixed thread count."""
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(config.threads)


def make_dataset(config: MiniConfig) -> tuple[np.ndarray, np.ndarray]:
    """The 24 rows: inputs uniform in [-1, 1] from a dedicated seed, target a fixed polynomial of them.

    Only + and * are used for the target: they are correctly rounded everywhere, unlike sin or exp,
    so the data (and its identity hash) is the same on every platform.
    """
    rng = np.random.Generator(np.random.PCG64(config.data_seed))
    x = rng.uniform(-1.0, 1.0, size=(config.n_rows, config.n_inputs))
    target = 0.8 * x[:, 0] - 0.5 * x[:, 1] + 1.2 * x[:, 0] * x[:, 1]
    return x, target.reshape(config.n_rows, 1)


def build_model(config: MiniConfig) -> torch.nn.Sequential:
    """Linear(2, 8) → tanh → dropout → Linear(8, 1): 33 parameters."""
    return torch.nn.Sequential(
        torch.nn.Linear(config.n_inputs, config.hidden),
        torch.nn.Tanh(),
        torch.nn.Dropout(config.dropout),
        torch.nn.Linear(config.hidden, 1),
    )


def build_optimizer(model: torch.nn.Module, config: MiniConfig) -> torch.optim.Adam:
    return torch.optim.Adam(model.parameters(), lr=config.lr)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: MiniConfig
) -> torch.optim.lr_scheduler.StepLR:
    return torch.optim.lr_scheduler.StepLR(
        optimizer, step_size=config.step_size, gamma=config.gamma
    )


def seed_generators(config: MiniConfig) -> np.random.Generator:
    """Seed Python and torch globally and return the NumPy generator.

    Every process seeds, resumed ones too: a resume that skips the restore (the negative control) must
    still be deterministic, so that its divergence is a property of the protocol, not of the clock.
    """
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    return np.random.Generator(np.random.PCG64(config.seed))


def _flat_parameters(model: torch.nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def train_step(run: LiveRun) -> None:
    """One update: draw a new order at the end of an epoch, then gain, noise and dropout, and record it."""
    config = run.config
    if run.cursor == config.n_rows:
        run.permutation = run.generator.permutation(config.n_rows).tolist()
        run.epoch += 1
        run.cursor = 0
    rows = run.permutation[run.cursor : run.cursor + config.batch_size]
    run.cursor += config.batch_size
    gain = random.uniform(1.0 - config.gain_spread, 1.0 + config.gain_spread)
    noise = run.generator.normal(0.0, config.noise_std, size=config.batch_size)
    inputs = run.x[rows] * gain
    targets = run.y[rows] + torch.from_numpy(noise).reshape(-1, 1)
    lr = float(run.optimizer.param_groups[0]["lr"])
    run.optimizer.zero_grad(set_to_none=True)
    loss = F.mse_loss(run.model(inputs), targets)
    loss.backward()
    run.optimizer.step()
    run.scheduler.step()
    run.step += 1
    record = StepRecord(
        step=run.step,
        epoch=run.epoch,
        row_ids=rows,
        gain=gain,
        noise=noise.tolist(),
        lr=lr,
        loss=loss.item(),
        parameters_after=_flat_parameters(run.model),
    )
    run.history.append(record)
    log.info(
        "step %d  epoch %d  rows %s  lr %.6g  loss %.6g",
        record.step,
        record.epoch,
        rows,
        lr,
        record.loss,
    )


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """MSE on the full data set in eval mode (no dropout, no gain, no noise): deterministic."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        mse = F.mse_loss(model(x), y).item()
    model.train(was_training)
    return mse


def peek_next_draws(generator: np.random.Generator, count: int = PEEKED_DRAWS) -> NextDraws:
    """Draw the next values of each generator, then put every state back as it was."""
    python_state = random.getstate()
    python_draws = [random.random() for _ in range(count)]
    random.setstate(python_state)
    numpy_state = generator.bit_generator.state
    numpy_draws = generator.random(count).tolist()
    generator.bit_generator.state = numpy_state
    torch_state = torch.get_rng_state()
    torch_draws = torch.rand(count, dtype=torch.float64).tolist()
    torch.set_rng_state(torch_state)
    return NextDraws(python_random=python_draws, numpy_pcg64=numpy_draws, torch_cpu=torch_draws)


def fresh_run(config: MiniConfig, x: torch.Tensor, y: torch.Tensor) -> LiveRun:
    """A run at step 0: seeded generators, new objects, the first epoch's order."""
    generator = seed_generators(config)
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    permutation = generator.permutation(config.n_rows).tolist()
    model.train()
    return LiveRun(
        config=config,
        x=x,
        y=y,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        generator=generator,
        step=0,
        epoch=0,
        cursor=0,
        permutation=permutation,
        history=[],
    )


def resumed_run(
    checkpoint: LoadedCheckpoint,
    config: MiniConfig,
    x: torch.Tensor,
    y: torch.Tensor,
    restore_rng: bool,
    sabotage: str | None,
) -> LiveRun:
    """A run continued from ``checkpoint``; ``restore_rng`` False is the negative control, and
    ``sabotage`` (one of ``SABOTAGES``) breaks the restore on purpose."""
    # The seed's order: rebuild the objects (which consumes randomness), load model, scheduler, then
    # optimizer, and restore the generators last, right before continuing.
    generator = seed_generators(config)
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    if sabotage == SCHEDULER_AFTER_OPTIMIZER:
        model.load_state_dict(checkpoint.model)
        optimizer.load_state_dict(checkpoint.optimizer)
        scheduler = _scheduler_built_after_optimizer_load(optimizer, config)
        scheduler.load_state_dict(checkpoint.scheduler)
    else:
        scheduler = build_scheduler(optimizer, config)
        model.load_state_dict(checkpoint.model)
        scheduler.load_state_dict(checkpoint.scheduler)
        if sabotage == SKIP_OPTIMIZER_STATE:
            log.warning("SABOTAGE %s: Adam's moments and step count are not restored", sabotage)
        else:
            optimizer.load_state_dict(checkpoint.optimizer)
    progress = checkpoint.progress
    cursor = progress.cursor
    if sabotage == SKIP_DATA_CURSOR:
        log.warning(
            "SABOTAGE %s: the epoch restarts at row 0 of its order instead of %d", sabotage, cursor
        )
        cursor = 0
    if restore_rng:
        _restore_generators(checkpoint, generator, skip_numpy=sabotage == SKIP_NUMPY_RNG)
    else:
        log.warning("random generators NOT restored (--omit-rng-restore): this run must diverge")
    model.train()
    return LiveRun(
        config=config,
        x=x,
        y=y,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        generator=generator,
        step=progress.step,
        epoch=progress.epoch,
        cursor=cursor,
        permutation=list(progress.permutation),
        history=list(checkpoint.history),
    )


def _scheduler_built_after_optimizer_load(
    optimizer: torch.optim.Optimizer, config: MiniConfig
) -> torch.optim.lr_scheduler.StepLR:
    """SABOTAGE: the scheduler is constructed after ``optimizer.load_state_dict()``.

    The seed warns that the construction may then overwrite the restored learning rate. With torch
    2.13, StepLR's initial step rescales the group's *current* lr (chainable form), so for StepLR + Adam
    the late construction alone is harmless: the lr sequence stays 0.015, 0.0075, ... (checked). The
    schedulers whose initial step is closed-form (LambdaLR, MultiplicativeLR, OneCycleLR, ...) do
    overwrite it with ``initial_lr * factor(0)``. To prove that the verifier catches that failure, this
    sabotage makes the late construction do exactly that: the resumed run restarts from lr 0.03.
    """
    log.warning(
        "SABOTAGE %s: scheduler built after the optimizer load; its construction resets the lr",
        SCHEDULER_AFTER_OPTIMIZER,
    )
    scheduler = build_scheduler(optimizer, config)
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"]
    return scheduler


def generator_states(generator: np.random.Generator) -> dict[str, Any]:
    """The three generators' states as the checkpoint stores them (primitives and a uint8 tensor)."""
    version, internal, gauss_next = random.getstate()
    return {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": generator.bit_generator.state,
        "torch_cpu": torch.get_rng_state(),
    }


def _restore_generators(
    checkpoint: LoadedCheckpoint, generator: np.random.Generator, skip_numpy: bool
) -> None:
    state = checkpoint.python_rng
    random.setstate((state.version, tuple(state.internal), state.gauss_next))
    if skip_numpy:
        log.warning("SABOTAGE %s: the NumPy generator is not restored", SKIP_NUMPY_RNG)
    else:
        generator.bit_generator.state = checkpoint.numpy_rng.model_dump()
    torch.set_rng_state(checkpoint.torch_rng)
