"""`step_NNNNNN.json`: everything a resume needs beyond the seed payload, as validated JSON.

A checkpoint exists only when its manifest exists, parses, and matches its payload (size and
sha256). The manifest is written after the payload is durable, so it is the commit marker.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from andrea.protocol.lossentry import LossEntry

from ..config import ModelConfig
from ..data import CursorState
from ..process import CheckpointReason, StopReason
from .rngstate import RngState

FORMAT_VERSION = 1

#: What made a checkpoint: a stop or checkpoint request (signal or control), the cadence, the end of
#: training, or a pivot boundary.
Trigger = Literal[StopReason, CheckpointReason, "cadence", "end", "boundary"]
#: Checkpoints an operator asked for: audit points, kept by default (see CheckpointConfig).
REQUESTED_TRIGGERS = frozenset({"sigusr1", "control", "boundary"})


def code_version() -> str:
    """The installed andrea's version, as manifests record it."""
    try:
        return "andrea " + version("andrea")
    except PackageNotFoundError:
        return "andrea (not installed)"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LayoutEntry(_M):
    name: str
    shape: list[int]
    offset: int = Field(ge=0, description="element offset inside each of the three flat arrays")


class OptimizerState(_M):
    name: Literal["AdamW"] = "AdamW"
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    grad_clip: float
    fused: bool
    adam_step: int = Field(
        ge=0, description="Adam's bias-correction step count, same for every parameter"
    )


class SchedulerState(_M):
    kind: Literal["warmup-cosine"] = "warmup-cosine"
    lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int
    last_step: int
    last_lr: float
    next_lr: float


class Progress(_M):
    step: int = Field(ge=1)
    tokens_seen: int = Field(ge=0)
    segment: int = Field(ge=1, description="the trainer process life that wrote this checkpoint")
    train_seconds: float = Field(ge=0, description="training wall time summed over all segments")


class Environment(_M):
    """What bit-exactness depends on. A resume that changes any of these is announced as inexact."""

    device: str
    dtype: str
    threads: int
    torch_version: str
    numpy_version: str
    python_version: str
    code_version: str


class MixingState(_M):
    mode: Literal["fixed", "proxy"]
    phase: int = 0
    arms: list[str]


class Manifest(_M):
    format_version: Literal[1] = FORMAT_VERSION
    step: int = Field(ge=1)
    n_params: int = Field(ge=1)
    bin_file: str
    bin_size: int
    bin_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    layout: list[LayoutEntry]
    model: ModelConfig
    optimizer: OptimizerState
    scheduler: SchedulerState
    rng: RngState
    data: list[CursorState]
    mixing: MixingState
    progress: Progress
    trigger: Trigger
    environment: Environment
    config_hash: str
    config: dict[str, Any]
    created_utc: str
    pending_losses: list[LossEntry] = Field(
        default_factory=list,
        description="loss records of steps <= step that the proxy had not yet acknowledged; re-sent on resume",
    )
