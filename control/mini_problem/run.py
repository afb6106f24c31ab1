"""One path of the protocol: train (resuming from a checkpoint if asked), checkpoint, and write the
summary that the verifier compares between paths."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from pydantic import JsonValue

from andrea.control.mini_problem.checkpoint import (
    checkpoint_payload,
    load_checkpoint,
    save_checkpoint,
)
from andrea.control.mini_problem.experiment import (
    LiveRun,
    configure_torch,
    evaluate,
    fresh_run,
    make_dataset,
    peek_next_draws,
    resumed_run,
    train_step,
)
from andrea.control.mini_problem.identity import code_version, current_versions, data_identity
from andrea.control.mini_problem.schema import (
    CHECKPOINT_NAME,
    SUMMARY_FORMAT,
    SUMMARY_NAME,
    CheckpointInfo,
    Identity,
    MiniConfig,
    MiniSummary,
    Progress,
    Refused,
    ResumeInfo,
)
from andrea.daemon.rundir.durable import atomic_write_bytes

log = logging.getLogger(__name__)


def _jsonable(value: Any) -> JsonValue:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot report a {type(value).__name__} in a summary")


def _summary(
    run: LiveRun,
    identity: Identity,
    checkpoint: CheckpointInfo,
    resumed: ResumeInfo | None,
    steps_run: list[int],
) -> MiniSummary:
    return MiniSummary(
        format=SUMMARY_FORMAT,
        config=identity.config,
        resumed=resumed,
        steps_run=steps_run,
        history=run.history,
        final_parameters={name: tensor.tolist() for name, tensor in run.model.state_dict().items()},
        optimizer_state=_jsonable(run.optimizer.state_dict()),
        scheduler_state=_jsonable(run.scheduler.state_dict()),
        progress=Progress(
            step=run.step, epoch=run.epoch, cursor=run.cursor, permutation=list(run.permutation)
        ),
        eval_mse=evaluate(run.model, run.x, run.y),
        next_lr=float(run.optimizer.param_groups[0]["lr"]),
        next_draws=peek_next_draws(run.generator),
        checkpoint=checkpoint,
        code_version=identity.code_version,
        data_identity=identity.data_identity,
        versions=identity.versions,
    )


def train(
    steps: int,
    output: Path,
    resume: Path | None = None,
    restore_rng: bool = True,
    sabotage: str | None = None,
) -> MiniSummary:
    """Run ``steps`` updates (after resuming from ``resume`` if given) and write the evidence to ``output``.

    Raises :class:`Refused` before writing anything if ``output`` exists or the checkpoint is unusable.
    Sets torch's global dtype and thread count: meant to own its process.
    """
    if output.exists() or output.is_symlink():
        raise Refused(
            f"output directory {output} already exists; choose a new one (earlier evidence is never overwritten)"
        )
    config = MiniConfig()
    configure_torch(config)
    x_rows, y_rows = make_dataset(config)
    identity = Identity(config, code_version(), data_identity(x_rows, y_rows), current_versions())
    checkpoint = load_checkpoint(resume, identity) if resume is not None else None
    try:
        output.mkdir(parents=True)
    except FileExistsError as exc:
        raise Refused(
            f"output directory {output} appeared meanwhile; refusing to share it"
        ) from exc

    x, y = torch.from_numpy(x_rows), torch.from_numpy(y_rows)
    resumed: ResumeInfo | None = None
    if checkpoint is None:
        run = fresh_run(config, x, y)
    else:
        log.info(
            "resuming from %s (step %d, sha256 %s)",
            resume,
            checkpoint.progress.step,
            checkpoint.sha256,
        )
        run = resumed_run(checkpoint, config, x, y, restore_rng, sabotage)
        resumed = ResumeInfo(
            checkpoint=str(resume),
            sha256=checkpoint.sha256,
            step=checkpoint.progress.step,
            rng_restored=restore_rng,
            sabotage=sabotage,
        )
    first = run.step + 1
    for _ in range(steps):
        train_step(run)
    info = save_checkpoint(output / CHECKPOINT_NAME, checkpoint_payload(run, identity), identity)
    summary = _summary(run, identity, info, resumed, list(range(first, run.step + 1)))
    atomic_write_bytes(output / SUMMARY_NAME, summary.model_dump_json(indent=2).encode())
    return summary
