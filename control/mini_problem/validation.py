"""What a checkpoint must satisfy before anything in it is used: its schema (every key, type and
shape), its identity (config, code, data, versions) and its consistency (progress, history, weights,
optimizer and scheduler describe the same moment). Every failure is a :class:`CheckpointError`."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from pydantic import BaseModel, ValidationError

from andrea.control.mini_problem.experiment import build_model, build_optimizer, build_scheduler
from andrea.control.mini_problem.schema import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    Identity,
    LoadedCheckpoint,
    MiniConfig,
    NumpyRngState,
    Progress,
    PythonRngState,
    StepRecord,
    Versions,
)

_ADAM_STATE_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq"})


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckpointError(message)


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], value: Any, what: str) -> _M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise CheckpointError(f"checkpoint {what} does not match its schema: {exc}") from exc


@dataclass(frozen=True)
class _Template:
    parameter_shapes: dict[str, tuple[int, ...]]
    param_group: dict[str, Any]
    scheduler_keys: frozenset[str]


def _template(config: MiniConfig) -> _Template:
    # fork_rng: building the reference objects must not move the global torch generator.
    with torch.random.fork_rng(devices=[]):
        model = build_model(config)
        optimizer = build_optimizer(model, config)
        scheduler = build_scheduler(optimizer, config)
    return _Template(
        parameter_shapes={name: tuple(t.shape) for name, t in model.state_dict().items()},
        param_group=dict(optimizer.state_dict()["param_groups"][0]),
        scheduler_keys=frozenset(scheduler.state_dict()),
    )


_TOP_LEVEL_KEYS = frozenset(
    {
        "format",
        "config",
        "code_version",
        "data_identity",
        "versions",
        "model",
        "optimizer",
        "scheduler",
        "rng",
        "progress",
        "history",
    }
)


def parse_checkpoint(obj: Any, config: MiniConfig, digest: str) -> LoadedCheckpoint:
    """Schema: every expected key, of the expected type and shape, and nothing else."""
    _check_top_level(obj)
    template = _template(config)
    _check_model_schema(obj["model"], template)
    _check_optimizer_schema(obj["optimizer"], template)
    _check_scheduler_schema(obj["scheduler"], template)
    python_rng, numpy_rng, torch_rng = _parse_rng(obj["rng"])
    history = obj["history"]
    _require(isinstance(history, list), "history is not a list")
    return LoadedCheckpoint(
        sha256=digest,
        config=_validated(MiniConfig, obj["config"], "config"),
        code_version=obj["code_version"],
        data_identity=obj["data_identity"],
        versions=_validated(Versions, obj["versions"], "versions"),
        model=obj["model"],
        optimizer=obj["optimizer"],
        scheduler=obj["scheduler"],
        python_rng=python_rng,
        numpy_rng=numpy_rng,
        torch_rng=torch_rng,
        progress=_validated(Progress, obj["progress"], "progress"),
        history=[_validated(StepRecord, record, "history record") for record in history],
    )


def _check_top_level(obj: Any) -> None:
    _require(isinstance(obj, dict), f"checkpoint is a {type(obj).__name__}, not a dict")
    keys = set(obj)
    _require(
        keys == _TOP_LEVEL_KEYS,
        f"checkpoint keys: missing {sorted(_TOP_LEVEL_KEYS - keys)}, unexpected {sorted(keys - _TOP_LEVEL_KEYS)}",
    )
    _require(
        obj["format"] == CHECKPOINT_FORMAT,
        f"checkpoint format {obj['format']!r}, expected {CHECKPOINT_FORMAT!r}",
    )
    for key in ("code_version", "data_identity"):
        _require(
            isinstance(obj[key], str) and re.fullmatch(r"[0-9a-f]{64}", obj[key]) is not None,
            f"checkpoint {key} is not a sha256",
        )


def _check_scheduler_schema(scheduler: Any, template: _Template) -> None:
    _require(
        isinstance(scheduler, dict) and set(scheduler) == template.scheduler_keys,
        f"scheduler keys must be {sorted(template.scheduler_keys)}",
    )
    for key in ("last_epoch", "_step_count", "step_size"):
        _require(type(scheduler[key]) is int, f"scheduler {key} is not an int")
    for key in ("base_lrs", "_last_lr"):
        _require(
            isinstance(scheduler[key], list)
            and len(scheduler[key]) == 1
            and type(scheduler[key][0]) is float,
            f"scheduler {key} must be one float",
        )
    _require(type(scheduler["gamma"]) is float, "scheduler gamma is not a float")


def _parse_rng(rng: Any) -> tuple[PythonRngState, NumpyRngState, torch.Tensor]:
    """The three generator states, each checked to be one its generator can take back."""
    _require(
        isinstance(rng, dict) and set(rng) == {"python", "numpy", "torch_cpu"},
        "rng must hold exactly 'python', 'numpy' and 'torch_cpu'",
    )
    python_rng = _validated(PythonRngState, rng["python"], "Python rng state")
    _require(
        python_rng.version == 3 and len(python_rng.internal) == 625,
        "Python rng state is not a Mersenne Twister state",
    )
    _require(
        all(0 <= v < 2**32 for v in python_rng.internal[:624])
        and 0 <= python_rng.internal[624] <= 624,
        "Python rng state out of range",
    )
    numpy_rng = _validated(NumpyRngState, rng["numpy"], "NumPy rng state")
    _require(
        0 <= numpy_rng.state.state < 2**128 and 0 <= numpy_rng.state.inc < 2**128,
        "PCG64 state out of range",
    )
    _require(
        numpy_rng.has_uint32 in (0, 1) and 0 <= numpy_rng.uinteger < 2**32,
        "PCG64 buffered word out of range",
    )
    torch_rng = rng["torch_cpu"]
    expected_bytes = torch.get_rng_state().numel()
    _require(
        isinstance(torch_rng, torch.Tensor)
        and torch_rng.dtype == torch.uint8
        and torch_rng.dim() == 1
        and torch_rng.numel() == expected_bytes,
        f"torch rng state must be a uint8 tensor of {expected_bytes} bytes",
    )
    return python_rng, numpy_rng, torch_rng


def _check_model_schema(model: Any, template: _Template) -> None:
    _require(isinstance(model, Mapping), "checkpoint model state is not a mapping")
    _require(
        set(model) == set(template.parameter_shapes),
        f"model keys {sorted(model)} != {sorted(template.parameter_shapes)}",
    )
    for name, shape in template.parameter_shapes.items():
        tensor = model[name]
        _require(
            isinstance(tensor, torch.Tensor)
            and tensor.dtype == torch.float64
            and tuple(tensor.shape) == shape,
            f"model {name} must be a float64 tensor of shape {shape}",
        )


def _check_optimizer_schema(optimizer: Any, template: _Template) -> None:
    _require(
        isinstance(optimizer, dict) and set(optimizer) == {"state", "param_groups"},
        "optimizer state must hold exactly 'state' and 'param_groups'",
    )
    groups = optimizer["param_groups"]
    _require(
        isinstance(groups, list) and len(groups) == 1 and isinstance(groups[0], dict),
        "optimizer must have exactly one param group",
    )
    group = groups[0]
    # The scheduler adds initial_lr to the group; a checkpoint without it was saved without a scheduler.
    expected_keys = set(template.param_group) | {"initial_lr"}
    _require(
        set(group) == expected_keys,
        f"optimizer param group keys {sorted(group)} != {sorted(expected_keys)}",
    )
    for key, value in template.param_group.items():
        if key != "lr":
            _require(
                type(group[key]) is type(value) and group[key] == value,
                f"optimizer {key}={group[key]!r}, expected {value!r}",
            )
    for key in ("lr", "initial_lr"):
        _require(type(group[key]) is float, f"optimizer {key} is not a float")
    state = optimizer["state"]
    shapes = list(template.parameter_shapes.values())
    _require(
        isinstance(state, dict) and set(state) == set(range(len(shapes))),
        f"optimizer state must have one entry per parameter (0..{len(shapes) - 1})",
    )
    for index, shape in enumerate(shapes):
        entry = state[index]
        _require(
            isinstance(entry, dict) and set(entry) == _ADAM_STATE_KEYS,
            f"optimizer state {index} keys must be {sorted(_ADAM_STATE_KEYS)}",
        )
        step = entry["step"]
        _require(
            isinstance(step, torch.Tensor) and step.dim() == 0 and step.is_floating_point(),
            f"optimizer state {index} step is not a scalar tensor",
        )
        for key in ("exp_avg", "exp_avg_sq"):
            tensor = entry[key]
            _require(
                isinstance(tensor, torch.Tensor)
                and tensor.dtype == torch.float64
                and tuple(tensor.shape) == shape,
                f"optimizer state {index} {key} must be a float64 tensor of shape {shape}",
            )


def check_identity(checkpoint: LoadedCheckpoint, identity: Identity) -> None:
    """Same experiment, same code, same data, same versions: otherwise a resume proves nothing."""
    _require(
        checkpoint.config == identity.config,
        f"checkpoint config {checkpoint.config} differs from this experiment's {identity.config}",
    )
    _require(
        checkpoint.code_version == identity.code_version,
        f"checkpoint written by another version of the andrea.control.mini_problem package "
        f"(code sha256 {checkpoint.code_version[:12]}…, this one {identity.code_version[:12]}…)",
    )
    _require(
        checkpoint.data_identity == identity.data_identity,
        f"checkpoint trained on other data "
        f"(data sha256 {checkpoint.data_identity[:12]}…, this data {identity.data_identity[:12]}…)",
    )
    _require(
        checkpoint.versions == identity.versions,
        f"checkpoint written with {checkpoint.versions}, this process runs {identity.versions}: "
        "the continuation would not be bit-exact",
    )


def check_consistency(checkpoint: LoadedCheckpoint, config: MiniConfig) -> None:
    """Progress, history, weights, optimizer and scheduler must all describe the same moment."""
    _check_progress(checkpoint.progress, checkpoint.history, config)
    _check_history_records(checkpoint.history, config)
    _check_weights_and_moments(checkpoint)
    _check_scheduler_state(checkpoint, config)


def _check_progress(progress: Progress, history: list[StepRecord], config: MiniConfig) -> None:
    """Step, epoch, cursor and order agree with each other and with the history's last batch."""
    step, epoch, cursor = progress.step, progress.epoch, progress.cursor
    _require(step >= 1, f"progress step {step}: a checkpoint exists only after at least one update")
    _require(
        sorted(progress.permutation) == list(range(config.n_rows)),
        "progress permutation is not an order of the data rows",
    )
    _require(
        epoch >= 0 and 0 < cursor <= config.n_rows and cursor % config.batch_size == 0,
        f"progress epoch {epoch} cursor {cursor} is out of range",
    )
    _require(
        step * config.batch_size == epoch * config.n_rows + cursor,
        f"progress inconsistent: {step} updates of {config.batch_size} rows "
        f"cannot end at epoch {epoch}, cursor {cursor}",
    )
    _require(
        [record.step for record in history] == list(range(1, step + 1)),
        f"history does not hold exactly steps 1..{step}",
    )
    last = history[-1]
    _require(
        last.epoch == epoch
        and last.row_ids == progress.permutation[cursor - config.batch_size : cursor],
        "history's last batch is not the one before the progress cursor",
    )


def _check_history_records(history: list[StepRecord], config: MiniConfig) -> None:
    for record in history:
        _require(
            len(record.row_ids) == config.batch_size and len(record.noise) == config.batch_size,
            f"history step {record.step} is not one batch",
        )
        numbers = [record.gain, record.lr, record.loss, *record.noise, *record.parameters_after]
        _require(
            all(math.isfinite(v) for v in numbers),
            f"history step {record.step} holds non-finite values",
        )


def _check_weights_and_moments(checkpoint: LoadedCheckpoint) -> None:
    """The weights are the ones recorded after the last step, and Adam counted every step."""
    step = checkpoint.progress.step
    weights = torch.cat([checkpoint.model[name].reshape(-1) for name in checkpoint.model])
    _require(bool(torch.isfinite(weights).all()), "model weights are not finite")
    _require(
        weights.tolist() == checkpoint.history[-1].parameters_after,
        f"model weights are not the weights recorded after step {step}",
    )
    for index, entry in checkpoint.optimizer["state"].items():
        _require(
            entry["step"].item() == step,
            f"optimizer state {index} counts {entry['step'].item():g} updates, progress says {step}",
        )
        _require(
            bool(
                torch.isfinite(entry["exp_avg"]).all() and torch.isfinite(entry["exp_avg_sq"]).all()
            ),
            f"optimizer state {index} is not finite",
        )


def _check_scheduler_state(checkpoint: LoadedCheckpoint, config: MiniConfig) -> None:
    """The scheduler stepped once per update, with the config's schedule, and set the optimizer's lr."""
    step = checkpoint.progress.step
    scheduler = checkpoint.scheduler
    _require(
        scheduler["last_epoch"] == step and scheduler["_step_count"] == step + 1,
        f"scheduler at epoch {scheduler['last_epoch']} ({scheduler['_step_count']} calls), "
        f"progress says {step} updates",
    )
    _require(
        scheduler["step_size"] == config.step_size
        and scheduler["gamma"] == config.gamma
        and scheduler["base_lrs"] == [config.lr],
        "scheduler hyper-parameters differ from the config",
    )
    group = checkpoint.optimizer["param_groups"][0]
    _require(
        group["initial_lr"] == config.lr,
        f"optimizer initial_lr {group['initial_lr']} differs from the config's {config.lr}",
    )
    _require(
        scheduler["_last_lr"] == [group["lr"]],
        f"scheduler's last lr {scheduler['_last_lr']} is not the optimizer's lr {group['lr']}",
    )
