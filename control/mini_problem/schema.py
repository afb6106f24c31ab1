"""The mini problem's contracts: file names and formats, the refusals, and every record that crosses a
file boundary (the checkpoint's parts and ``summary.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, JsonValue

from andrea.control.verify_options import MINI_SABOTAGES

CHECKPOINT_FORMAT = "andrea-mini-checkpoint/1"
SUMMARY_FORMAT: Literal["andrea-mini-summary/1"] = "andrea-mini-summary/1"
CHECKPOINT_NAME = "checkpoint.pt"
SUMMARY_NAME = "summary.json"
#: How many upcoming values of each generator a summary reports.
PEEKED_DRAWS = 3

#: Deliberately broken resumes. They exist only so that tests can prove every check can fail.
SABOTAGES = MINI_SABOTAGES


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
