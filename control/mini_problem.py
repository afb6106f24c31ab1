"""The mini resume-verification problem: a tiny training run whose stop and resume can be proved exact.

Twenty-four synthetic rows (two inputs, one target), a 33-parameter network with dropout, batches of
four rows, Adam and StepLR, on the CPU in float64 with one thread. Three random generators shape the
trajectory: Python ``random`` draws a small gain applied to each batch's inputs, a NumPy PCG64
``Generator`` draws the target noise and the per-epoch shuffles, and torch draws the dropout masks.
Five updates stop mid-epoch (cursor 20 of 24); ten cross into a second shuffle. A resume is exact only
if the checkpoint restores all of it: weights, Adam's moments, the scheduler, the three generators and
the data order with its cursor.

    python -m andrea.control.mini_problem train --steps 10 --output runs/continuous
    python -m andrea.control.mini_problem train --steps 5 --output runs/stop
    python -m andrea.control.mini_problem train --steps 5 --resume runs/stop/checkpoint.pt --output runs/resume

Every run writes ``checkpoint.pt``, ``checkpoint.pt.sha256`` and ``summary.json`` into a directory that
must not exist yet. Exit codes: 0 done; 2 refused (output exists, bad arguments, a checkpoint that is
corrupt or inconsistent); anything else is a crash. ``andrea.control.verify_resume`` runs the paths and
compares them.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import logging
import math
import platform
import random
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from andrea.control.verify_options import (
    MINI_SABOTAGES,
    SCHEDULER_AFTER_OPTIMIZER,
    SKIP_DATA_CURSOR,
    SKIP_NUMPY_RNG,
    SKIP_OPTIMIZER_STATE,
)
from andrea.daemon.durable import atomic_write_bytes

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REFUSED = 2

CHECKPOINT_FORMAT = "andrea-mini-checkpoint/1"
SUMMARY_FORMAT = "andrea-mini-summary/1"
CHECKPOINT_NAME = "checkpoint.pt"
SUMMARY_NAME = "summary.json"
#: How many upcoming values of each generator a summary reports.
PEEKED_DRAWS = 3

#: Deliberately broken resumes. They exist only so that tests can prove every check can fail.
SABOTAGES = MINI_SABOTAGES

_ADAM_STATE_KEYS = frozenset({"step", "exp_avg", "exp_avg_sq"})


class Refused(Exception):
    """The run must not start: the reason is for the operator, and nothing was written."""


class CheckpointError(Refused):
    """A checkpoint that cannot be trusted to continue the run exactly."""


class _Strict(BaseModel):
    # Strict: a checkpoint or summary whose fields changed type is inconsistent, not something to coerce.
    # NaN is written as NaN (not null) so that a comparison sees it and fails on it.
    model_config = ConfigDict(
        strict=True, extra="forbid", frozen=True, ser_json_inf_nan="constants"
    )


class MiniConfig(_Strict):
    """The experiment. Fixed by the protocol; recorded so that a resume can prove it is the same one."""

    seed: int = 20260924
    data_seed: int = 4242
    n_rows: int = 24
    n_inputs: int = 2
    hidden: int = 8
    dropout: float = 0.25
    batch_size: int = 4
    lr: float = 0.03
    step_size: int = 3
    gamma: float = 0.5
    gain_spread: float = 0.05
    noise_std: float = 0.1
    dtype: Literal["float64"] = "float64"
    threads: int = 1
    device: Literal["cpu"] = "cpu"


class Versions(_Strict):
    """Interpreter and library versions: bit-exactness is only claimed within one set."""

    python: str
    torch: str
    numpy: str


class Progress(_Strict):
    """Where the run stands after ``step`` completed updates."""

    step: int
    epoch: int
    cursor: int
    permutation: list[int]


class StepRecord(_Strict):
    """One completed update: what it consumed, drew, used and produced."""

    step: int
    epoch: int
    row_ids: list[int]
    gain: float
    noise: list[float]
    lr: float
    loss: float
    parameters_after: list[float]


class PythonRngState(_Strict):
    """``random.getstate()`` as primitives."""

    version: int
    internal: list[int]
    gauss_next: float | None


class Pcg64Counter(_Strict):
    state: int
    inc: int


class NumpyRngState(_Strict):
    """``Generator.bit_generator.state`` of a PCG64 generator (integers and strings only)."""

    bit_generator: Literal["PCG64"]
    state: Pcg64Counter
    has_uint32: int
    uinteger: int


class NextDraws(_Strict):
    """The next values each generator would produce, observed without consuming them."""

    python_random: list[float]
    numpy_pcg64: list[float]
    torch_cpu: list[float]


class CheckpointInfo(_Strict):
    file: str
    sha256: str
    bytes: int


class ResumeInfo(_Strict):
    checkpoint: str
    sha256: str
    step: int
    rng_restored: bool
    sabotage: str | None


class MiniSummary(_Strict):
    """What one path reports in ``summary.json``; the verifier compares these between paths."""

    format: Literal["andrea-mini-summary/1"]
    config: MiniConfig
    resumed: ResumeInfo | None
    steps_run: list[int]
    history: list[StepRecord]
    final_parameters: dict[str, JsonValue]
    optimizer_state: JsonValue
    scheduler_state: JsonValue
    progress: Progress
    eval_mse: float
    next_lr: float
    next_draws: NextDraws
    checkpoint: CheckpointInfo
    code_version: str
    data_identity: str
    versions: Versions


@dataclass(frozen=True)
class Identity:
    """What a checkpoint must share with the process that resumes it."""

    config: MiniConfig
    code_version: str
    data_identity: str
    versions: Versions


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint that passed the schema checks (and, from :func:`load_checkpoint`, all the others)."""

    sha256: str
    config: MiniConfig
    code_version: str
    data_identity: str
    versions: Versions
    model: Mapping[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    python_rng: PythonRngState
    numpy_rng: NumpyRngState
    torch_rng: torch.Tensor
    progress: Progress
    history: list[StepRecord]


@dataclass
class _Run:
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


# --- experiment ---------------------------------------------------------------------------------------


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


def data_identity(x: np.ndarray, y: np.ndarray) -> str:
    """sha256 of the data set's exact bytes (little-endian float64, shapes included)."""
    digest = hashlib.sha256(b"andrea-mini-data/1")
    for array in (x, y):
        digest.update(repr(array.shape).encode())
        digest.update(np.ascontiguousarray(array, dtype="<f8").tobytes())
    return digest.hexdigest()


def code_version() -> str:
    """sha256 of this module's source: any edit makes older checkpoints another experiment."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def current_versions() -> Versions:
    return Versions(python=platform.python_version(), torch=torch.__version__, numpy=np.__version__)


def current_identity(config: MiniConfig) -> Identity:
    """The identity of this process's experiment, to stamp on or check against a checkpoint."""
    x, y = make_dataset(config)
    return Identity(config, code_version(), data_identity(x, y), current_versions())


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


def _train_step(run: _Run) -> None:
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


def _fresh_run(config: MiniConfig, x: torch.Tensor, y: torch.Tensor) -> _Run:
    generator = seed_generators(config)
    model = build_model(config)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config)
    permutation = generator.permutation(config.n_rows).tolist()
    model.train()
    return _Run(
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


def _resumed_run(
    checkpoint: LoadedCheckpoint,
    config: MiniConfig,
    x: torch.Tensor,
    y: torch.Tensor,
    restore_rng: bool,
    sabotage: str | None,
) -> _Run:
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
    return _Run(
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


def _generator_states(generator: np.random.Generator) -> dict[str, Any]:
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


# --- checkpoint ---------------------------------------------------------------------------------------


def _payload(run: _Run, identity: Identity) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "config": identity.config.model_dump(),
        "code_version": identity.code_version,
        "data_identity": identity.data_identity,
        "versions": identity.versions.model_dump(),
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "rng": _generator_states(run.generator),
        "progress": {
            "step": run.step,
            "epoch": run.epoch,
            "cursor": run.cursor,
            "permutation": list(run.permutation),
        },
        "history": [record.model_dump() for record in run.history],
    }


def save_checkpoint(path: Path, payload: Mapping[str, Any], identity: Identity) -> CheckpointInfo:
    """Write the checkpoint, re-read it, and only then mark it usable by writing its fingerprint.

    The fingerprint file is in ``sha256sum`` format (``sha256sum -c`` accepts it); its comment line
    carries the byte size, which the loader checks too.
    """
    buffer = io.BytesIO()
    torch.save(dict(payload), buffer)
    data = buffer.getvalue()
    atomic_write_bytes(path, data)
    # The re-read proves the file on disk is complete and loadable the restricted way. Full consistency
    # (progress, history, optimizer steps) is the loader's judgement, made when someone resumes from it.
    reread = path.read_bytes()
    if reread != data:
        raise OSError(f"{path}: the bytes read back differ from the bytes written")
    digest = hashlib.sha256(data).hexdigest()
    _check_identity(
        _parse(
            torch.load(io.BytesIO(reread), map_location="cpu", weights_only=True),
            identity.config,
            digest,
        ),
        identity,
    )
    fingerprint = f"# {CHECKPOINT_FORMAT}, {len(data)} bytes\n{digest}  {path.name}\n"
    atomic_write_bytes(_fingerprint_path(path), fingerprint.encode())
    return CheckpointInfo(file=path.name, sha256=digest, bytes=len(data))


def _fingerprint_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


_SIZE_LINE = re.compile(r"^# .*, (\d+) bytes$")
_HASH_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


def _read_fingerprint(path: Path) -> tuple[str, int]:
    fingerprint = _fingerprint_path(path)
    if not fingerprint.is_file():
        raise CheckpointError(
            f"{fingerprint}: missing; a checkpoint without its fingerprint was never marked usable"
        )
    sizes: list[int] = []
    hashes: list[tuple[str, str]] = []
    for line in fingerprint.read_text(encoding="utf-8", errors="replace").splitlines():
        if size := _SIZE_LINE.match(line):
            sizes.append(int(size.group(1)))
        elif entry := _HASH_LINE.match(line):
            hashes.append((entry.group(1), entry.group(2)))
        elif line.strip():
            raise CheckpointError(f"{fingerprint}: unexpected line {line[:80]!r}")
    if len(sizes) != 1 or len(hashes) != 1:
        raise CheckpointError(f"{fingerprint}: expected one size line and one sha256 line")
    digest, name = hashes[0]
    if name != path.name:
        raise CheckpointError(f"{fingerprint}: fingerprints {name!r}, not {path.name!r}")
    return digest, sizes[0]


def load_checkpoint(path: Path, identity: Identity) -> LoadedCheckpoint:
    """Load a checkpoint for resuming, or raise :class:`CheckpointError` saying why it cannot be used.

    Checked before anything is used: fingerprint (size and sha256), restricted loading
    (``weights_only=True``), schema (every key, type and shape), identity (config, code, data,
    versions) and the consistency of progress, history, optimizer and scheduler with each other.
    """
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    digest, size = _read_fingerprint(path)
    # Hash and load the same bytes, so that the file cannot change between the check and the use.
    data = path.read_bytes()
    if len(data) != size:
        raise CheckpointError(
            f"{path}: {len(data)} bytes, its fingerprint says {size} (truncated or replaced)"
        )
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise CheckpointError(
            f"{path}: sha256 {actual} does not match its fingerprint {digest} (corrupted or modified)"
        )
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # the restricted unpickler raises several types; all mean "unusable"
        raise CheckpointError(f"{path}: cannot be loaded with weights_only=True: {exc}") from exc
    checkpoint = _parse(obj, identity.config, digest)
    _check_identity(checkpoint, identity)
    _check_consistency(checkpoint, identity.config)
    return checkpoint


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


def _parse(obj: Any, config: MiniConfig, digest: str) -> LoadedCheckpoint:
    """Schema: every expected key, of the expected type and shape, and nothing else."""
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
    template = _template(config)
    _check_model_schema(obj["model"], template)
    _check_optimizer_schema(obj["optimizer"], template)
    scheduler = obj["scheduler"]
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

    rng = obj["rng"]
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
        scheduler=scheduler,
        python_rng=python_rng,
        numpy_rng=numpy_rng,
        torch_rng=torch_rng,
        progress=_validated(Progress, obj["progress"], "progress"),
        history=[_validated(StepRecord, record, "history record") for record in history],
    )


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


def _check_identity(checkpoint: LoadedCheckpoint, identity: Identity) -> None:
    """Same experiment, same code, same data, same versions: otherwise a resume proves nothing."""
    _require(
        checkpoint.config == identity.config,
        f"checkpoint config {checkpoint.config} differs from this experiment's {identity.config}",
    )
    _require(
        checkpoint.code_version == identity.code_version,
        f"checkpoint written by another version of mini_problem.py "
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


def _check_consistency(checkpoint: LoadedCheckpoint, config: MiniConfig) -> None:
    """Progress, history, weights, optimizer and scheduler must all describe the same moment."""
    progress, history = checkpoint.progress, checkpoint.history
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
    weights = torch.cat([checkpoint.model[name].reshape(-1) for name in checkpoint.model])
    _require(bool(torch.isfinite(weights).all()), "model weights are not finite")
    _require(
        weights.tolist() == last.parameters_after,
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


# --- summary and command line -------------------------------------------------------------------------


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
    run: _Run,
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
        run = _fresh_run(config, x, y)
    else:
        log.info(
            "resuming from %s (step %d, sha256 %s)",
            resume,
            checkpoint.progress.step,
            checkpoint.sha256,
        )
        run = _resumed_run(checkpoint, config, x, y, restore_rng, sabotage)
        resumed = ResumeInfo(
            checkpoint=str(resume),
            sha256=checkpoint.sha256,
            step=checkpoint.progress.step,
            rng_restored=restore_rng,
            sabotage=sabotage,
        )
    first = run.step + 1
    for _ in range(steps):
        _train_step(run)
    info = save_checkpoint(output / CHECKPOINT_NAME, _payload(run, identity), identity)
    summary = _summary(run, identity, info, resumed, list(range(first, run.step + 1)))
    atomic_write_bytes(output / SUMMARY_NAME, summary.model_dump_json(indent=2).encode())
    return summary


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m andrea.control.mini_problem", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    train_parser = commands.add_parser("train", help="train, checkpoint and summarise one path")
    train_parser.add_argument(
        "--steps", type=int, required=True, help="updates to run (in addition to the resumed ones)"
    )
    train_parser.add_argument(
        "--output",
        type=Path,
        required=True,
        help="new directory for checkpoint.pt, its .sha256 and summary.json",
    )
    train_parser.add_argument("--resume", type=Path, help="checkpoint.pt to continue from")
    train_parser.add_argument(
        "--omit-rng-restore",
        action="store_true",
        help="negative control: resume without restoring the random generators",
    )
    train_parser.add_argument(
        "--sabotage",
        choices=SABOTAGES,
        help="deliberately break the resume (tests of the verifier only)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.resume is None and (args.omit_rng_restore or args.sabotage):
        parser.error("--omit-rng-restore and --sabotage only apply with --resume")
    try:
        summary = train(
            args.steps, args.output, args.resume, not args.omit_rng_restore, args.sabotage
        )
    except Refused as exc:
        log.error("refused: %s", exc)
        return EXIT_REFUSED
    print(
        f"{args.output}: step {summary.progress.step} "
        f"(epoch {summary.progress.epoch}, cursor {summary.progress.cursor}), "
        f"eval MSE {summary.eval_mse!r}, next lr {summary.next_lr!r}"
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
