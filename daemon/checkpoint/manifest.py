"""`step_NNNNNN.json`: everything a resume needs beyond the seed payload, as validated JSON.

A checkpoint exists only when its manifest exists, parses, and matches its payload (size and
sha256). The manifest is written after the payload is durable, so it is the commit marker.

The manifest verifies itself: `content_sha256` is the SHA-256 of its canonical content (every other
field, see `canonical_bytes`), so that any edit — a changed `adam_step`, a cursor moved by one, one
base64 character of an RNG state — makes the checkpoint damaged, skipped with its reason, instead of
a resume that silently diverges. Format 1 manifests (written before the hash existed) carry none and
still load; see docs/checkpoint-format.md for how they are told apart from a stripped format 2 one.
"""

from __future__ import annotations

import hashlib
import json
import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.rngstate import SHAPE_ONLY, RngState
from andrea.daemon.config import ModelConfig
from andrea.daemon.data.arms import CursorState
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.runtime.operator_requests import CheckpointReason, StopReason
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lineage import Lineage, WorldSpan
from andrea.protocol.lossentry import HeldoutLoss, LossEntry

FORMAT_VERSION: Literal[2] = 2
#: Format 1 had no content hash; it is read, never written.
LEGACY_FORMAT_VERSION = 1
#: The most a manifest can need (defined with the run directory's names, where the torch-free tools
#: that read manifests find it).
MAX_MANIFEST_BYTES = rundir.MAX_MANIFEST_BYTES
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

#: What made a checkpoint: a stop or checkpoint request (signal or control), the cadence, the end of
#: training, or a pivot boundary.
Trigger = Literal[StopReason, CheckpointReason, "cadence", "end", "boundary"]


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
    segment: int = Field(
        ge=1, description="the segment (numbered stretch of the trainer's records) that wrote it"
    )
    train_seconds: float = Field(ge=0, description="training wall time summed over all segments")


#: How a job held the model: every rank a whole replica (a single process, DDP), or sharded (FSDP).
Sharding = Literal["replicated", "fsdp"]


class Environment(_M):
    """What bit-exactness depends on. A resume that changes any of these is announced as inexact.

    The fields after `code_version` were added with distributed training; manifests written before
    lack them and read as a single process on CPU or an unrecorded GPU."""

    device: str
    dtype: str
    threads: int
    torch_version: str
    numpy_version: str
    python_version: str
    code_version: str
    world_size: int = Field(1, ge=1, description="processes of the job (torchrun's WORLD_SIZE)")
    deterministic: bool = Field(
        False, description="torch deterministic algorithms, cuBLAS workspace, math attention"
    )
    gpu: str | None = Field(
        None, description="the model of the GPU in use, e.g. 'NVIDIA H100 80GB HBM3'"
    )
    compute_capability: str | None = None
    cuda_driver: str | None = Field(None, description="the NVIDIA kernel driver's version")
    cuda_runtime: str | None = Field(None, description="the CUDA version torch was built with")
    cudnn: str | None = None
    nccl: str | None = None
    compiled: bool = Field(
        False, description="the training step ran through torch.compile (absent before: False)"
    )
    sharding: Sharding = Field(
        "replicated",
        description="how the job held the model: replicated (a single process, or DDP) or fsdp "
        "(sharded over the ranks); absent before: replicated",
    )


class RankState(_M):
    """What one rank of a distributed job needs beyond the replicated weights, m and v."""

    rank: int = Field(ge=0)
    rng: RngState
    data: list[CursorState]


class DistributedState(_M):
    """A checkpoint of a job of several ranks. Every rank's RNG and cursor states, indexed by
    global rank, reached rank 0 by a collective; `rng` and `data` at the top level are rank 0's."""

    world_size: int = Field(ge=2)
    backend: str
    ranks: list[RankState]

    @model_validator(mode="after")
    def _one_state_per_rank(self) -> DistributedState:
        if [r.rank for r in self.ranks] != list(range(self.world_size)):
            raise ValueError(
                f"ranks {[r.rank for r in self.ranks]} are not exactly 0..{self.world_size - 1}"
            )
        return self


class MixingState(_M):
    mode: Literal["fixed", "proxy"]
    phase: int = 0
    arms: list[str]


class Manifest(_M):
    # A diverged arm's held-out loss (NaN) is spelled as a loss record spells it, so that it
    # survives the round trip; every other number of a manifest is finite.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")

    format_version: Literal[1, 2] = FORMAT_VERSION
    step: int = Field(ge=1, le=checkpoint_format.INT32_MAX)
    n_params: int = Field(ge=1, le=checkpoint_format.INT32_MAX)
    bin_file: str = Field(description="always step_NNNNNN.bin of this step: a plain file name")
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
    distributed: DistributedState | None = Field(
        None, description="per-rank states of a job of several ranks; None for a single process"
    )
    pending_losses: list[LossEntry] = Field(
        default_factory=list,
        description="loss records of steps <= step that the proxy had not yet acknowledged; re-sent on resume",
    )
    last_eval_step: int = Field(
        0,
        ge=0,
        description="the newest step evaluated on held-out data; a resume at an evaluation step "
        "that was not evaluated (a stop interrupted it) evaluates it first",
    )
    heldout: dict[str, HeldoutLoss] | None = Field(
        None,
        description="held-out loss per arm of the checkpointed weights, when `step` was evaluated: "
        "the loss record of the next step carries them (absent in manifests written before)",
    )
    pending_evals: list[EvalEntry] = Field(
        default_factory=list,
        description="evaluation records the proxy had not yet acknowledged; re-sent on resume",
    )
    lineage: Lineage | None = Field(
        None,
        description="the world sizes the run trained at and the checkpoint it started from "
        "(--init-from); absent in manifests written before: one world size, its own start",
    )
    source_manifest: dict[str, Any] | None = Field(
        None,
        description="with lineage.init_from: the manifest of the checkpoint the run started from, "
        "as it was read (its own lineage included)",
    )
    tokenizer: str = Field(
        "bytes",
        description='what the run\'s text was encoded with: "bytes", or the sha256 of its '
        "tokenizer.json (absent before tokenizers existed: bytes)",
    )
    content_sha256: str | None = Field(
        None, description="SHA-256 of the canonical content (format 2); absent in format 1"
    )

    def lineage_or_default(self) -> Lineage:
        """The lineage, or for a manifest written before lineages were recorded: one world size
        (the one that wrote it) from the start."""
        if self.lineage is not None:
            return self.lineage
        return Lineage(world_sizes=[WorldSpan(from_step=0, world_size=self.environment.world_size)])

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        # Cross-field rules that hold for every checkpoint ever written; a manifest that breaks one
        # was edited or damaged, and is skipped before its payload is allocated or read.
        if self.bin_file != rundir.bin_name(self.step):
            raise ValueError(
                f"bin_file {self.bin_file!r} is not {rundir.bin_name(self.step)!r} "
                "(a payload is always the plain file of its own step)"
            )
        if self.bin_size != checkpoint_format.payload_size(self.n_params):
            raise ValueError(f"bin_size {self.bin_size} does not fit n_params {self.n_params}")
        total = 0
        for e in self.layout:
            if e.offset != total or any(d < 1 for d in e.shape):
                raise ValueError(f"layout entry {e.name!r} is not contiguous or has an empty shape")
            size = 1
            for d in e.shape:
                size *= d
            total += size
        if total != self.n_params:
            raise ValueError(f"layout holds {total} parameters, n_params says {self.n_params}")
        if any(e.step > self.step for e in self.pending_losses):
            raise ValueError("pending_losses holds a step after the checkpoint")
        if self.content_sha256 is not None and not _SHA256_RE.match(self.content_sha256):
            raise ValueError("content_sha256 is not 64 hex digits")
        return self


def canonical_bytes(content: dict[str, Any]) -> bytes:
    """The canonical form the content hash covers: the manifest's JSON object without
    `content_sha256`, keys sorted, no whitespace, UTF-8. Any JSON tool can recompute it."""
    body = {k: v for k, v in content.items() if k != "content_sha256"}
    return json.dumps(
        body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def encode_manifest(manifest: Manifest) -> bytes:
    """The file content of a manifest, with its content hash (always the current format)."""
    content = json.loads(manifest.model_dump_json(exclude={"content_sha256"}))
    content["format_version"] = FORMAT_VERSION
    content["content_sha256"] = hashlib.sha256(canonical_bytes(content)).hexdigest()
    return json.dumps(content, indent=1, ensure_ascii=False, allow_nan=False).encode()


def decode_manifest(raw: bytes, *, rng_trial: bool = True) -> Manifest:
    """Parse and verify a manifest's bytes. ValueError (a ValidationError included) naming the
    first problem when it is not intact: not JSON, a field out of range, or a content hash that
    does not match (an edit). `rng_trial=False` is for readers that never restore the RNG states:
    they are checked without torch (rngstate.py)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError(f"{len(raw):,} bytes, more than a manifest can hold")
    try:
        content = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(content, dict):
        raise ValueError("not a JSON object")
    claimed = content.get("content_sha256")
    if claimed is None and content.get("format_version") != LEGACY_FORMAT_VERSION:
        raise ValueError("no content_sha256: only format 1 manifests may lack it")
    if claimed is not None:
        try:
            actual = hashlib.sha256(canonical_bytes(content)).hexdigest()
        except ValueError as e:  # NaN or Infinity: never written by encode_manifest
            raise ValueError(f"not canonical JSON ({e})") from None
        if actual != claimed:
            raise ValueError(
                f"content_sha256 {str(claimed)[:12]}… does not match the content ({actual[:12]}…):"
                " the manifest was edited or damaged"
            )
    return Manifest.model_validate(content, context=None if rng_trial else SHAPE_ONLY)
