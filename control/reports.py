"""The JSON document each andreactl command prints with ``--json`` (or ``-o json``): a pydantic model
per document, and :data:`REPORTS`, the registry of each command's model(s), so that every output has a
schema (``andreactl schema COMMAND`` prints it; docs/andreactl.md lists them). Timestamps are
RFC 3339 in UTC (``2026-11-30T10:16:00.123Z``); durations are seconds.

A command prints exactly one document on stdout (``watch``: one per line), everything meant for a
person on stderr.
"""

from __future__ import annotations

import functools
import importlib
import operator
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lineage import Lineage
from andrea.protocol.status import ProxyStatus, RewardReport, TrainerStatus


def utc_now() -> datetime:
    return datetime.now(UTC)


class _Report(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckpointInfo(_Report):
    """A checkpoint on disk, from its manifest."""

    step: int
    trigger: str
    created: datetime = Field(description="when its manifest was written (RFC 3339)")
    age_seconds: float


class OfflineSummary(_Report):
    """What the run directory says when the trainer is not running."""

    last_checkpoint: CheckpointInfo | None
    logged_step: int | None = Field(description="newest step in .loss.json")
    segment: int | None
    phase: int | None
    loss_ema: float | None = Field(description="loss EMA of the canonical curve at logged_step")
    policy_fingerprint: str | None
    reward: RewardReport | None = Field(
        None,
        description="the bandit's reward and each arm's standing as of the proxy's last "
        ".state.json (its live_reward); null for a fixed mixture or a state written before the "
        "reward could be chosen",
    )
    last_eval: EvalEntry | None = Field(None, description="newest entry of .eval.json")
    lineage: Lineage | None = Field(
        None,
        description="of the newest checkpoint: world sizes, and the checkpoint it started from",
    )
    problems: list[str] = Field(
        default_factory=list,
        description="run-directory files that could not be read (a link, a FIFO, garbage), and why",
    )


class DaemonLiveness(_Report):
    """What one daemon's lock and socket say about it."""

    state: Literal["answering", "not answering", "paused", "not running"] = Field(
        description="not running: nobody holds its lock; paused: its lock's holder is stopped "
        "(SIGSTOP) and runs nothing until SIGCONT; not answering: it holds its lock, runs, but "
        "did not answer within 3 s"
    )
    pid: int | None = Field(None, description="the lock's holder, as the kernel lists it")


class StatusReport(_Report):
    """``andreactl status`` (and each line of ``watch``)."""

    time: datetime
    run_dir: str
    state: Literal["running", "stopped", "partial", "paused"] = Field(
        description="running: trainer answers; stopped: neither daemon runs; paused: the trainer "
        "holds its lock but is stopped (SIGSTOP); partial: only the proxy runs, or a daemon holds "
        "its lock but does not answer"
    )
    daemons: dict[str, DaemonLiveness] = Field(
        default_factory=dict, description="trainer and proxy: what their locks and sockets say"
    )
    mixing: Literal["fixed", "proxy"] | None = Field(
        None, description="the run's mixing (run.toml), which says whether it has a proxy at all"
    )
    trainer: TrainerStatus | None = Field(description="the trainer's live status, or null")
    proxy: ProxyStatus | None = Field(description="the proxy's live status, or null")
    offline: OfflineSummary | None = Field(
        description="from the run directory's files when the trainer is not running"
    )


class RequestReport(_Report):
    """``checkpoint`` and ``stop``: what the trainer answered."""

    time: datetime
    command: Literal["checkpoint", "stop"]
    ok: bool
    step: int | None = Field(description="the step checkpointed (or to be), when the trainer says")
    checkpoint: str | None = Field(description="the checkpoint file, once durable (--wait)")
    detail: dict[str, Any] = Field(description="everything else the trainer answered")
    error: str | None


class BoundsRow(_Report):
    """One arm's bounds under the running policy and the new one."""

    arm: str
    old_floor: float
    old_cap: float
    new_floor: float
    new_cap: float
    changed: bool
    live: bool = Field(description="a zombie's bounds are ignored")


class PivotReport(_Report):
    """``pivot`` (and ``pivot --dry-run``): the pivot made, or the one that would be made."""

    time: datetime
    dry_run: bool = Field(description="true: nothing was changed; boundary_step is the next one")
    phase: int = Field(description="the phase that starts after boundary_step")
    boundary_step: int
    archive: str | None = Field(
        description="where the ended phase was archived, relative to the run directory (null for "
        "a dry run)"
    )
    already: bool = Field(
        description="always false: the proxy runs each pivot once (kept for the document's shape)"
    )
    old_policy: str = Field(description="fingerprint of the policy of the ended phase")
    new_policy: str = Field(description="fingerprint of the new phase's policy")
    changes: list[str] = Field(description="each differing setting, `key: old → new`")
    bounds: list[BoundsRow]


class PivotCancelReport(_Report):
    """``pivot --cancel``."""

    time: datetime
    hold_id: str
    outcome: str = Field(description="released after step N, or cancelled before the boundary")
    pivoted: bool = Field(description="the proxy had already pivoted at the hold's step")


class CheckpointRow(_Report):
    step: int
    trigger: str
    bytes: int
    created: str | None = Field(description="when its manifest was written (RFC 3339)")
    state: str = Field(description='"ok", "size ok" (not hashed: --quick) or "damaged: why"')
    intact: bool
    pivot_boundary: bool


class CheckpointsReport(_Report):
    """``checkpoints``: every checkpoint with a manifest, newest first."""

    time: datetime
    checkpoints: list[CheckpointRow]
    total_bytes: int


class PruneReport(_Report):
    """``prune`` (and ``prune --dry-run``)."""

    time: datetime
    dry_run: bool
    removed: list[int] = Field(description="steps removed (or that would be)")
    kept: dict[int, str] = Field(description="step → why it is kept")
    bytes: int = Field(description="bytes freed (or that would be)")


class HistoryRow(_Report):
    step: int
    loss: float | str = Field(description='a number, or "NaN", "Infinity", "-Infinity"')
    lr: float
    arm: str
    tokens: int
    segment: int
    phase: int
    time: datetime
    arm_loss_ema: float | None = Field(
        None,
        description="the loss EMA of the row's arm over that arm's steps only (as metrics "
        "export's arm_loss_ema); null before the arm's first finite loss",
    )


class HistoryReport(_Report):
    """``andreactl history``: the canonical loss curve, or with --arm one arm's steps of it."""

    run_dir: str
    arm: str | None = Field(None, description="--arm: the arm whose steps the rows are")
    rows: list[HistoryRow]


class EvalHistoryReport(_Report):
    """``andreactl history --eval``: the canonical evaluations (newest entry per step)."""

    run_dir: str
    rows: list[EvalEntry]


class SamplesReport(_Report):
    run_dir: str
    records: list[dict[str, Any]] = Field(description="the newest records of .samples.json")


class Generation(BaseModel):
    """One prompt's continuation."""

    prompt: str
    prompt_tokens: int
    text: str = Field(description="the continuation, decoded (the prompt not repeated)")
    tokens: list[int] = Field(description="the continuation's ids")
    window_slid: bool = Field(description="prompt + continuation exceeded block_size")


class GenerateReport(_Report):
    """``andreactl generate``: what was loaded, the sampling settings, and each continuation."""

    source: str
    step: int
    tokenizer: str = Field(description='"bytes" or the tokenizer file\'s sha256')
    block_size: int
    seed: int
    temperature: float
    top_k: int | None
    top_p: float | None
    max_new_tokens: int
    outputs: list[Generation]


class PlotReport(_Report):
    out: str
    steps: int
    restarts: list[int] = Field(description="first step of each segment after the first")
    pivots: list[int] = Field(description="boundary step of each pivot")
    audit_checkpoints: list[int]
    zombies: list[str]


class MetricsReport(_Report):
    format: Literal["tensorboard", "csv", "jsonl"]
    out: str
    steps: int
    evaluations: int = Field(
        0, description="held-out evaluations of .eval.json written (tensorboard only)"
    )


class SizeReport(_Report):
    preset: str
    n_params: int
    checkpoint_bytes: int


class TokenizerArm(_Report):
    arm: str
    documents: int = Field(description="training documents the tokenizer was trained on")
    held_out: int = Field(description="held-out documents, never seen by the training")
    bytes: int = Field(description="bytes of its training documents")
    bytes_per_token: float | None = Field(
        description="compression: bytes per token on the first 4 MiB of its training documents"
    )
    warning: str | None = Field(
        None,
        description="set when the tokenizer drops most of that text (its ids decode back to "
        "less than half of its characters), with the figures",
    )


class TokenizerTrainReport(_Report):
    """``tokenizer train``: the tokenizer written, and its compression on each arm."""

    time: datetime
    run_dir: str
    out: str = Field(description="the tokenizer.json written")
    sha256: str = Field(description="its identity, part of the run's data identity")
    n_vocab: int = Field(description="ids the tokenizer has")
    model_vocab_size: int = Field(
        description="the [model] vocab_size it implies: n_vocab rounded up to a multiple of 64"
    )
    heldout_fraction: float | None = Field(
        description="the run's held-out fraction, whose documents were left out"
    )
    arms: list[TokenizerArm]
    seconds: float
    cache_dir: str | None = Field(
        None,
        description="the token cache the arms were encoded into with the new tokenizer, so that "
        "the run's first start reads no document again (null: not warmed, --no-cache)",
    )
    cache_seconds: float | None = Field(None, description="how long that encoding took")


class TokenizerEncodeReport(_Report):
    """``tokenizer encode``: the tokens file written and the tokenizer that made it."""

    time: datetime
    out: str
    record: str = Field(description="OUT.json: which tokenizer made the file")
    tokenizer: str = Field(description='"bytes", or the sha256 of the tokenizer.json')
    tokenizer_file: str | None
    n_vocab: int
    dtype: Literal["uint8", "uint16", "uint32"]
    inputs: int = Field(description="input files")
    input_bytes: int
    documents: int
    tokens: int
    seconds: float
    tokens_per_second: float
    warning: str | None = Field(
        None,
        description="set when the tokenizer drops most of the text (measured on the first "
        "64 KiB of documents: bytes per token, the share its ids decode back to)",
    )


class PlanGpu(_Report):
    name: str = Field(
        description='a row of the table ("h100", "h200", "a100-80gb", "l40s"), or "custom"'
    )
    memory_bytes: int = Field(description="memory of one GPU (nominal, 10^9-byte GB)")
    peak_tflops: float = Field(description="dense peak of one GPU at the plan's precision")
    count: int


class PlanBatch(_Report):
    """How a step's batch is cut (daemon/data/batch_split.py): per step, per micro-batch, per GPU."""

    sequences_per_step: int = Field(description="batch_size: over the whole job")
    grad_accum: int
    sequences_per_micro_batch: int = Field(description="over the whole job")
    sequences_per_gpu_micro_batch: int
    tokens_per_step: int
    tokens_per_gpu_per_step: int
    tokens_per_gpu_micro_batch: int


class PlanMemory(_Report):
    """One GPU's memory in bytes during a step, under the plan's strategy and recompute."""

    strategy: str = Field(
        "ddp",
        description='"ddp": each GPU holds the whole state; "fsdp": weights, gradients and Adam\'s '
        "moments sharded over the GPUs (fully_shard per block, then the root)",
    )
    recompute: bool = Field(False, description="activation recompute per block")
    weights: int = Field(description="fp32 master weights (FSDP: this GPU's shard)")
    gradients: int = Field(description="fp32 gradients (FSDP: this GPU's shard)")
    adam_moments: int = Field(description="m and v in fp32, and a step count per tensor")
    bf16_weight_copies: int = Field(
        description="autocast's bf16 copies of the matrices (bf16 under DDP only: FSDP's gathered "
        "units are its bf16 copies)"
    )
    gathered: int = Field(
        0,
        description="FSDP: the all-gathered units in the compute dtype (the root, the block "
        "computing and the next, prefetched, with a block's gradients before their reduce-scatter)",
    )
    activations: int = Field(description="estimated peak of a forward and backward pass")
    activations_per_sequence: int
    checkpoint_staging: int = Field(
        description="on the GPU: 0; checkpoints are staged in pinned host memory (host_staging)"
    )
    runtime_reserve: int = Field(description="CUDA context, cuBLAS workspace, allocator slack")
    total: int
    gpu_memory: int
    headroom: int = Field(description="gpu_memory - total; negative: does not fit")
    fits: bool
    largest_micro_batch: int = Field(description="the most sequences per GPU micro-batch that fit")
    host_staging: int = Field(description="pinned host memory for checkpoints, on rank 0's machine")
    attention: str = Field(description='"math" (T x T scores kept) or "fused" (flash)')


class PlanSpeed(_Report):
    mfu: float = Field(description="model FLOPs utilisation assumed or measured")
    mfu_source: str
    flops_per_token: int = Field(description="training FLOPs per token (6N + 12 L T C)")
    compute_seconds: float = Field(
        description="a step's arithmetic at the MFU (with recompute: each block's forward again)"
    )
    allreduce_seconds: float = Field(
        description="a step's communication, not overlapped: DDP's gradient all-reduce, or FSDP's "
        "two all-gathers of the weights and reduce-scatter of the gradients"
    )
    floor_seconds: float = Field(
        description="the host's least time per step (eager dispatch), measured; the step takes"
        " at least this"
    )
    step_seconds: float
    tokens_per_second: float = Field(description="over the whole job")
    steps: int
    training_seconds: float


class PlanData(_Report):
    training_tokens: int = Field(description="the run's training tokens, all arms")
    how: str = Field(description="counted (a checkpoint's manifest) or estimated, and how")
    planned_tokens: int = Field(description="tokens the planned steps train on")
    passes: float | None = Field(description="planned / training tokens (null: no data)")


class PlanCheckpoints(_Report):
    payload_bytes: int = Field(description="one step_NNNNNN.bin: 8 + 12 bytes per parameter")
    manifest_bytes: int = Field(description="one manifest, estimated")
    every: int
    disk_gbps: float
    write_seconds: float
    stall_seconds: float = Field(description="training time lost per cadence checkpoint")
    stalls_seconds: float = Field(description="over the planned steps")
    kept_cadence: int = Field(description="checkpoint.keep_latest, and one being written")
    kept_audit: int = Field(description="checkpoint.max_requested: SIGUSR1, control, pivots")
    checkpoint_disk_bytes: int
    loss_log_bytes: int
    export_bytes: int
    disk_bytes: int = Field(description="checkpoints, logs and the final export")


class PlanRental(_Report):
    training_hours: float
    checkpoint_stall_hours: float
    evaluation_hours: float
    stop_resume_hours: float = Field(description="one stop (final write), restart and resume")
    export_hours: float = Field(description="the final export and its verification")
    total_hours: float
    fits_days: dict[int, bool] = Field(description="whether it fits a 3, 7 and 30-day rental")


class PlanWindow(_Report):
    """``plan --days N``: the plan backwards, what a rental window of N days holds."""

    days: float
    steps: int = Field(description="the most steps whose rental hours fit in the window")
    tokens: int = Field(description="the tokens those steps train on (steps x tokens per step)")
    hours: float = Field(description="the rental hours of those steps (at most days x 24)")


class PlanOption(_Report):
    """One way to hold the model on the plan's GPUs: a strategy, with or without recompute."""

    strategy: Literal["ddp", "fsdp"]
    recompute: bool
    state_bytes: int = Field(
        description="per GPU before activations: weights, gradients, Adam, bf16 copies or gathered "
        "units, runtime reserve"
    )
    activations_per_sequence: int
    largest_micro_batch: int = Field(
        description="the most sequences per GPU micro-batch that fit (0: the model does not)"
    )
    fits: bool = Field(description="the plan's micro-batch fits")
    step_seconds: float


class PlanRecommendation(_Report):
    strategy: Literal["ddp", "fsdp"]
    recompute: bool
    why: str


class PlanScaleWindow(_Report):
    """A rental window's compute-optimal model (Chinchilla)."""

    days: int
    compute_flops: float = Field(description="C: GPUs x peak x MFU x the window's seconds")
    params: int = Field(description="N = sqrt(C / (6 x tokens per parameter))")
    tokens: int = Field(description="D = tokens per parameter x N")
    holds: dict[str, bool] = Field(
        description="per strategy, whether the largest model it holds (largest_params) has at "
        "least N parameters"
    )


class PlanScaling(_Report):
    """``plan``'s compute-optimal sizes and the largest model each strategy holds."""

    mfu: float
    mfu_source: str
    tokens_per_param: float
    shape_rule: str = Field(description="how a parameter count is made a shape")
    windows: list[PlanScaleWindow]
    largest_params: dict[str, int] = Field(
        description="per strategy, the largest model of the shape rule that holds one sequence per "
        "GPU with recompute (0: none)"
    )


class PlanReport(_Report):
    """``andreactl plan``: memory, time and disk of a run before renting."""

    source: str = Field(description="the preset, or the run.toml the model came from")
    preset: str
    model: dict[str, Any]
    n_params: int
    parameter_bytes: int
    optimizer_bytes: int
    precision: str
    gpu: PlanGpu
    batch: PlanBatch
    memory: PlanMemory
    speed: PlanSpeed
    checkpoints: PlanCheckpoints
    rental: PlanRental
    data: PlanData | None = Field(
        None, description="passes over the run's data (null: the data cannot be found)"
    )
    window: PlanWindow | None = Field(
        None, description="with --days: the steps and tokens the window holds (the plan is theirs)"
    )
    options: list[PlanOption] = Field(
        default_factory=list, description="DDP and FSDP, each without and with recompute"
    )
    recommended: PlanRecommendation | None = Field(
        None, description="the option to train with (null: none holds the model)"
    )
    scaling: PlanScaling | None = None
    assumptions: dict[str, str] = Field(description="each assumed figure and where it comes from")
    warnings: list[str]


class ErrorReport(_Report):
    """What every command prints with ``--json`` when it ends in an error (a usage error, a refusal,
    a run that does not answer) instead of its own document: a script reading stdout always gets
    one document, and the exit code in it."""

    time: datetime
    command: str | None = Field(description="the command, when it was recognised")
    exit_code: int
    error: str


#: A model of a --json document: the class, or ``"module:Name"`` for one whose module imports torch
#: (imported only when its schema or a validation asks for it).
ModelRef = type[BaseModel] | str

#: The model(s) of each command's --json document, the schema registry ``andreactl schema`` shows.
#: A command with two models prints one or the other: ``history --eval`` an EvalHistoryReport,
#: ``pivot --cancel`` a PivotCancelReport, ``tokenizer`` train or encode its own, record the
#: record it wrote. ``export`` and
#: ``verify-resume`` print the report file they write (export.json, verification.json;
#: docs/export.md and docs/resume-proof.md).
REPORTS: dict[str, tuple[ModelRef, ...]] = {
    "status": (StatusReport,),
    "watch": (StatusReport,),
    "checkpoint": (RequestReport,),
    "stop": (RequestReport,),
    "pivot": (PivotReport, PivotCancelReport),
    "checkpoints": (CheckpointsReport,),
    "prune": (PruneReport,),
    "history": (HistoryReport, EvalHistoryReport),
    "samples": (SamplesReport,),
    "plot": (PlotReport,),
    "metrics": (MetricsReport,),
    "size": (SizeReport,),
    "plan": (PlanReport,),
    "tokenizer": (
        TokenizerTrainReport,
        TokenizerEncodeReport,
        "andrea.daemon.data.encoding:TokensRecord",  # record: the FILE.json it wrote
    ),
    "generate": (GenerateReport,),
    "export": ("andrea.control.export.bundle:ExportReport",),
    "verify-resume": ("andrea.control.verify_resume.engine:VerificationReport",),
}


def _resolve(ref: ModelRef) -> type[BaseModel]:
    if not isinstance(ref, str):
        return ref
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def report_models(command: str) -> tuple[type[BaseModel], ...]:
    """The models of ``command``'s --json document: its own, then ErrorReport (printed instead when
    it ends in an error)."""
    return (*_own_models(command), ErrorReport)


def _own_models(command: str) -> tuple[type[BaseModel], ...]:
    """The model(s) of ``command``'s --json document (KeyError for a command that prints none)."""
    return tuple(_resolve(ref) for ref in REPORTS[command])


def report_adapter(command: str) -> TypeAdapter[Any]:
    """Validates a document of ``command`` against its model, or the union of its models."""
    return TypeAdapter(functools.reduce(operator.or_, report_models(command)))


def report_schema(command: str) -> dict[str, Any]:
    """The JSON Schema of ``command``'s --json document: its model's, or with two models a schema
    that accepts either (``anyOf``)."""
    models = report_models(command)
    if len(models) == 1:
        return models[0].model_json_schema()
    return report_adapter(command).json_schema()
