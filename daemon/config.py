"""Run configuration: presets, the `run.toml` file and command-line overrides, validated by pydantic.

The config is split by what a change would do to the run:
- *trajectory* settings (model, optimizer, batch, seed, data, mixing) decide every bit the run will
  produce; resuming under different ones is refused unless the operator says so;
- *operational* settings (max_steps, checkpoint policy, logging cadence, device, precision, threads)
  may change at any restart (a change of device, precision or threads is announced as not
  bit-exact). The LR schedule has its own horizon (`decay_steps`) precisely so that extending
  `max_steps` never changes the learning rates of steps already planned.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from andrea.daemon.data.heldout import DEFAULT_FRACTION
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.rundir.boundedio import FileRejected, read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes
from andrea.daemon.rundir.layout import (
    APPLIED_CONFIG_FILE,
    CONFIG_FILE,
    RESOLVED_CONFIG_FILE,
    recorded_config,
)
from andrea.daemon.runtime.validation_messages import Note, describe
from andrea.protocol.limits import MAX_SAMPLE_PROMPT, MAX_SAMPLES

Precision = Literal["auto", "fp32", "tf32", "bf16"]
#: Activation recompute (`ModelConfig.recompute`): none, or every transformer block.
Recompute = Literal["none", "blocks"]
#: `[data] windows`: where each epoch cuts an arm into training sequences (daemon/data/arms.py).
Windows = Literal["shifted", "fixed"]

#: The most sequences one optimizer step may train, over the whole job.
MAX_STEP_SEQUENCES = 4096


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the offending key."""


class _Strict(BaseModel):
    # strict: TOML and the command line give exact types, so `batch_size = "8"` or
    # `max_steps = 1e3` is a mistake to name, not a value to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


#: The largest vocabulary a model may hold: 16 times the largest public tokenizers' (256k). Past it
#: a value is a mistake (a tokenizer with one id at 100,000,000), whose embedding and head alone
#: would not fit any memory.
MAX_VOCAB_SIZE = 1 << 22


class ModelConfig(_Strict):
    """Shape of the GPT. Part of the checkpoint contract: resuming needs an identical one."""

    vocab_size: int = Field(
        256,
        ge=2,
        le=MAX_VOCAB_SIZE,
        description="ids the embedding and the head hold; default: the run's tokenizer's size rounded "
        "up to a multiple of 64 (256 for the byte-level tokenizer)",
    )
    block_size: int = Field(ge=1)
    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    n_embd: int = Field(ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = True
    recompute: Recompute = Field(
        "none",
        description="activation recompute, often called activation checkpointing but no "
        'checkpoint of the run: "blocks" keeps only each transformer block\'s input from the '
        "forward pass and computes the block again in the backward pass (about a third more "
        "arithmetic a step, far less activation memory); changes no bit of training, so it may "
        "change at any restart",
    )

    #: Settings that change how a step is computed, never a bit of what it computes: they may
    #: change at any restart, and the trajectory and the checkpoint's model leave them out.
    COMPUTE_ONLY: ClassVar[tuple[str, ...]] = ("recompute",)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        return self

    @model_serializer(mode="wrap")
    def _compute_only_when_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # At their defaults the compute-only settings are left out of every dump (run.toml, the
        # manifests), which therefore read as they did before the settings existed.
        out: dict[str, Any] = handler(self)
        for k in self.COMPUTE_ONLY:
            if out.get(k) == ModelConfig.model_fields[k].default:
                del out[k]
        return out

    def arithmetic(self) -> ModelConfig:
        """This model with every compute-only setting at its default: two models train the same
        bits from the same state exactly when these are equal."""
        return self.model_copy(
            update={k: ModelConfig.model_fields[k].default for k in self.COMPUTE_ONLY}
        )


class OptimConfig(_Strict):
    """AdamW and its schedule: linear warmup, cosine decay to `min_lr` over `decay_steps`, then flat."""

    lr: float = Field(1e-3, gt=0, allow_inf_nan=False)
    min_lr: float = Field(1e-4, ge=0, allow_inf_nan=False)
    warmup_steps: int = Field(100, ge=0)
    decay_steps: int = Field(
        5000,
        ge=1,
        description="length of the LR schedule: cosine decay to min_lr ends at this step, then flat. "
        "Independent of max_steps, so that extending a run never changes the LR of steps already planned",
    )
    # AdamW's own range checks, made here so that a bad value is a config error naming the key.
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0, allow_inf_nan=False)
    weight_decay: float = Field(0.1, ge=0, allow_inf_nan=False)
    grad_clip: float = Field(1.0, ge=0, allow_inf_nan=False, description="0 disables clipping")

    @model_validator(mode="after")
    def _a_schedule(self) -> OptimConfig:
        # Each value is valid alone; together these are no schedule: a "decay" that raises the
        # rate, or a warmup that ends after the decay did (the rate jumps from its peak to min_lr).
        if self.min_lr > self.lr:
            raise ValueError(
                f"min_lr {self.min_lr} is above lr {self.lr}: the decay would raise it"
            )
        if self.warmup_steps > self.decay_steps:
            raise ValueError(
                f"warmup_steps {self.warmup_steps} is past decay_steps {self.decay_steps}: the"
                " schedule would end before its warmup"
            )
        return self


#: The settings an arm is refused when its kind does not take them. The others (`part`, `paths`,
#: `path`, `dtype`) were never refused, and configs that hold one beside another kind (every arm's
#: dump held dtype = "uint8" once) are still accepted.
REFUSED_UNLESS_TAKEN = ("field", "links", "heldout_path")

#: The rule for an arm's name, wherever one is written (run config, policy, bandit state).
ARM_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


def _kinds_schema(schema: dict[str, JsonValue]) -> None:
    """The JSON schema of `ArmSpec.kind`: the registered kinds, as a `Literal`'s would be."""
    schema["enum"] = list[JsonValue](kinds.names())


class ArmSpec(_Strict):
    """One data source ("arm"). Its ``kind`` says how it is read: one of the kinds registered in
    daemon/data/kinds/, one module a kind, whose docstring says what its arms read and whose
    `ArmKind` says which of these settings it takes and needs (``stdlib``: ``part``; the kinds of
    document files, ``text``, ``jsonl`` and ``parquet``: ``paths`` globs, relative to the run
    directory, and ``links``; ``jsonl`` and ``parquet``: ``field``; ``tokens``: ``path``,
    ``dtype``, ``heldout_path``). Most kinds' text is encoded with the run's tokenizer
    (`DataConfig.tokenizer`); a kind of ids (``tokens``) says which tokenizer made them
    (daemon/data/encoding.py).
    """

    name: str = Field(pattern=ARM_NAME_PATTERN)
    kind: str = Field(
        description="how the arm is read: one of the arm kinds (daemon/data/kinds/)",
        json_schema_extra=_kinds_schema,
    )
    part: Literal["docstrings", "code", "comments"] | None = None
    paths: list[str] = Field(default_factory=list)
    path: str | None = None
    dtype: Literal["uint8", "uint16", "uint32"] | None = Field(
        None,
        description="tokens arms: the ids' type; may be left out only where the file says it (an "
        "llm.c header, its andrea record FILE.json, a nanoGPT meta.pkl beside it: "
        "daemon/data/token_files.py), never guessed",
    )
    heldout_path: str | None = Field(
        None,
        description="tokens arms: a token file of held-out ids (nanoGPT's val.bin), evaluated "
        "instead of spans of `path` held out by [data] heldout_fraction",
    )
    field: str | None = Field(
        None,
        min_length=1,
        description='jsonl and parquet arms: the field (column) holding the text (default "text")',
    )
    weight: float = Field(
        1.0,
        ge=0,
        le=1e6,
        allow_inf_nan=False,  # inf or 1e308 overflows the normalised shares: one arm took them all
        description="share in the fixed mixture (relative to the other arms' weights)",
    )
    links: Literal["inside", "follow"] | None = Field(
        None,
        description="text, jsonl and parquet arms: a link among the files its globs match is "
        "followed only when it leads inside the arm's directory or the run's (\"inside\", the "
        'default: any other is refused, naming it); "follow" follows every link (data kept behind '
        "links on purpose)",
    )

    @field_validator("kind")
    @classmethod
    def _registered(cls, value: str) -> str:
        if kinds.find(value) is None:
            raise ValueError(f"{value!r} is not an arm kind; the kinds: {', '.join(kinds.names())}")
        return value

    @model_validator(mode="after")
    def _fields_match_kind(self) -> ArmSpec:
        kind = kinds.kind(self.kind)
        if (problem := kind.check(self)) is not None:
            raise ValueError(problem)
        for setting in REFUSED_UNLESS_TAKEN:
            if getattr(self, setting) is not None and setting not in kind.settings:
                taken = kinds.taking(setting)
                raise ValueError(
                    f"arm {self.name!r}: {setting} is a setting of "
                    f"{', '.join(taken[:-1])}{' and ' if len(taken) > 1 else ''}{taken[-1]} "
                    "arms only"
                )
        return self

    @property
    def encoded(self) -> bool:
        """Whether the arm's text is encoded with the run's tokenizer (not a file of ids)."""
        return kinds.kind(self.kind).encoded

    def tokens_path(self) -> str:
        """A tokens arm's file, as the config names it (the validator requires it)."""
        if self.path is None:
            raise ValueError(f"arm {self.name!r}: kind {self.kind!r} names no tokens file")
        return self.path

    def stdlib_part(self) -> str:
        """A stdlib arm's part of the standard library (the validator requires it)."""
        if self.part is None:
            raise ValueError(f"arm {self.name!r}: kind {self.kind!r} names no stdlib part")
        return self.part


def default_arms() -> list[ArmSpec]:
    return [
        ArmSpec(name="docstrings", kind="stdlib", part="docstrings"),
        ArmSpec(name="code", kind="stdlib", part="code"),
        ArmSpec(name="comments", kind="stdlib", part="comments"),
    ]


#: The largest JSON Lines line read unless `[data] max_document_bytes` says otherwise: far above any
#: real document (a long book is a few MB), far below what would exhaust a machine's memory.
DEFAULT_MAX_DOCUMENT_BYTES = 64 << 20


class DataConfig(_Strict):
    arms: list[ArmSpec] = Field(default_factory=default_arms, min_length=1)
    cache_dir: str | None = Field(
        None,
        description="where tokenized arms are cached, relative to the run directory (--cache-dir: "
        "to the working directory); default $CACHE_DIRECTORY or ~/.cache/andrea",
    )
    tokenizer: str = Field(
        "bytes",
        min_length=1,
        description='"bytes" (token = byte value, 256 ids) or a Hugging Face tokenizers file '
        "(tokenizer.json, relative to the run directory) that encodes the text arms; part of the "
        "data's identity",
    )
    max_document_bytes: int | None = Field(
        None,
        ge=1 << 10,
        le=1 << 36,
        description="the largest document read, in bytes: a JSON Lines line, a Parquet row, or a "
        "text arm's file (one document); a longer one is a data error naming the file (and line) "
        f"(default {DEFAULT_MAX_DOCUMENT_BYTES:,}: 64 MiB)",
    )
    heldout_fraction: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="fraction of each arm's documents never trained on, chosen by a hash of each document's "
        f"identity (daemon/data/heldout.py); a new run's default: {DEFAULT_FRACTION}; absent in runs created "
        "before splits existed, which keep none; 0 holds out nothing",
    )
    windows: Windows | None = Field(
        None,
        description='where each epoch cuts an arm into training sequences: "shifted" (a new '
        "run's default) from an offset drawn per epoch, so that an arm repeated many times over "
        'is not seen as the same sequences every epoch; "fixed" (runs created before this '
        "setting, where it is absent) at the same places every epoch",
    )

    @property
    def document_bound(self) -> int:
        """The largest document read (a JSON Lines line, a text file), in bytes."""
        return self.max_document_bytes or DEFAULT_MAX_DOCUMENT_BYTES

    @model_validator(mode="after")
    def _unique_names(self) -> DataConfig:
        names = [a.name for a in self.arms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate arm names: {dup}")
        if sum(a.weight for a in self.arms) <= 0:
            raise ValueError("the fixed mixture needs at least one arm with weight > 0")
        return self


class CheckpointConfig(_Strict):
    every: int = Field(
        100,
        ge=0,
        description="cadence of checkpoints in steps; 0: only on request and at exit",
    )
    # Two at least: the newest may be the one being written when the machine dies.
    keep_latest: int = Field(3, ge=2)
    keep_requested: bool = Field(
        True, description="keep SIGUSR1/control checkpoints (audit points), up to max_requested"
    )
    max_requested: int = Field(
        20, ge=1, description="the most audit checkpoints kept; the oldest are retired beyond it"
    )
    async_write: bool = Field(
        True,
        description="cadence checkpoints: copy the state into a host buffer at the step boundary, then write "
        "and fsync it on a background thread while training continues (requested and final ones are always "
        "synchronous)",
    )


class DistributedConfig(_Strict):
    """How a job of several ranks shares the model (daemon/trainer/parallel/); a single process
    ignores it. Not a trajectory setting: a change resumes, announced as not bit-exact."""

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model and Adam state (DistributedDataParallel); "
        "fsdp: parameters, gradients and Adam's moments sharded over the ranks (FSDP2, "
        "fully_shard per transformer block); both write the same .bin",
    )


class MetricsConfig(_Strict):
    """Where the run's metrics go besides .loss.json (docs/observability.md). Operational: any restart may
    change it."""

    tensorboard: bool = Field(
        False, description="the proxy writes TensorBoard event files under RUN_DIR/tensorboard/"
    )
    prometheus_textfile_dir: str | None = Field(
        None,
        description="node_exporter's textfile-collector directory: each daemon keeps "
        "andrea-ROLE-RUN.prom there (relative paths are resolved against the run directory)",
    )
    prometheus_port: int | None = Field(
        None,
        ge=1,
        le=65534,
        description="serve /metrics over HTTP: the trainer on this port, the proxy on the next",
    )
    prometheus_address: str = Field(
        "127.0.0.1", description="address of the HTTP endpoint; localhost unless said otherwise"
    )


class EvalConfig(_Strict):
    """Held-out evaluation. Operational: it never changes a bit of a step's training, so it may
    change at any restart; under proxy mixing the bandit may read it (gated-plateau, gated-fall,
    gated-heldout), and a resume that changes it says so (`evaluation_changes`)."""

    every: int | None = Field(
        None,
        ge=0,
        description="steps between evaluations; default: the checkpoint cadence; 0 disables",
    )
    sequences: int = Field(
        64, ge=1, description="held-out sequences (block_size + 1 tokens) evaluated per arm"
    )


#: The highest sampling temperature (the trainer's samples and `andreactl generate`).
MAX_TEMPERATURE = 100.0
#: Below this a temperature samples greedily: its limit, and where a logit over it could overflow.
GREEDY_BELOW = 1e-6

#: The first tokens of a document that make a default sample prompt (`SamplesConfig.prompts`).
DEFAULT_PROMPT_TOKENS = 8


class SamplesConfig(_Strict):
    """The text samples the trainer generates for the audit (docs/evaluation.md#samples).
    Operational: sampling draws from a generator of its own, never from one training uses, so
    these may change at any restart without changing a bit of the trajectory."""

    every: int = Field(100, ge=0, description="steps between generated samples; 0: never")
    prompts: list[Annotated[str, Field(min_length=1, max_length=MAX_SAMPLE_PROMPT)]] | None = Field(
        None,
        min_length=1,
        max_length=MAX_SAMPLES,
        description="the texts samples continue, each encoded with the run's tokenizer; default: "
        f"the first {DEFAULT_PROMPT_TOKENS} tokens of each arm's first held-out document (of its "
        "training data when it holds none out), as the tokenizer itself cut them, so that no "
        "prompt ends where the tokenizer would not (a trailing space, say)",
    )
    max_new_tokens: int = Field(
        120, ge=1, le=4096, description="tokens generated after each prompt"
    )  # a sample must fit its message (16 KiB)
    temperature: float = Field(
        0.8,
        ge=0.0,
        le=MAX_TEMPERATURE,
        allow_inf_nan=False,
        description="softmax temperature of each next token; 0: greedy (the most likely one)",
    )
    top_k: int | None = Field(
        None,
        ge=1,
        le=MAX_VOCAB_SIZE,
        description="draw each next token from the k most likely only; default: from all",
    )


#: Seeds are below this, the trainer's and `andreactl generate`'s alike: torch's generators take
#: 64 bits, and a seed also travels as a signed 64-bit integer (the proxy's messages).
SEED_LIMIT = 2**63
#: A licence, language or dataset name of the Hugging Face Hub's metadata: plain characters, so
#: that the model card's front matter says exactly what was written.
_HUB_LICENSE = r"^[a-z0-9][a-z0-9.+-]{0,63}$"
_HUB_LANGUAGE = r"^[a-z]{2,3}(-[A-Za-z0-9]{1,8}){0,3}$"
_HUB_DATASET = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$"


class ExportConfig(_Strict):
    """The model card's metadata for the Hugging Face Hub (`andreactl export --format hf`,
    docs/export.md). Read from run.toml when the export is made, so it may be added or changed at
    any time; it changes nothing about training."""

    license: str | None = Field(
        None,
        pattern=_HUB_LICENSE,
        description="the Hub's licence identifier (apache-2.0, mit, cc-by-4.0, other, ...)",
    )
    language: list[Annotated[str, Field(pattern=_HUB_LANGUAGE)]] = Field(
        default_factory=list,
        max_length=64,
        description="the text's languages as ISO 639 codes (en, fr, pt-BR, ...)",
    )
    datasets: list[Annotated[str, Field(pattern=_HUB_DATASET)]] = Field(
        default_factory=list,
        max_length=64,
        description="the Hub datasets it was trained on (OWNER/NAME or NAME)",
    )


#: Settings of runs created before `[samples]` existed, at the top level of their run.toml: their
#: names there, and where they live now. Such a file still loads, meaning what it always meant.
LEGACY_SAMPLE_KEYS = {"sample_every": "every", "sample_tokens": "max_new_tokens"}


def upgrade_legacy(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a run.toml's, or a config dump's) with the older names of `LEGACY_SAMPLE_KEYS`
    moved into `[samples]`. ValueError when a setting is given under both names with two values."""
    moved = {new: values[old] for old, new in LEGACY_SAMPLE_KEYS.items() if old in values}
    samples = values.get("samples", {})
    if not moved or not isinstance(samples, dict):
        return values  # nothing to move, or a [samples] that is not a table: validation names it
    for old, new in LEGACY_SAMPLE_KEYS.items():
        if new in moved and new in samples and samples[new] != moved[new]:
            raise ValueError(
                f"{old} = {moved[new]!r} and samples.{new} = {samples[new]!r} set one setting "
                f"twice ({old} is the older name of samples.{new}); keep one"
            )
    out = {k: v for k, v in values.items() if k not in LEGACY_SAMPLE_KEYS}
    out["samples"] = {**moved, **samples}
    return out


class RunConfig(_Strict):
    """Everything one run needs. Built from a preset, then run.toml, then command-line flags."""

    preset: str = Field(
        "andrea-tiny",
        description="the model and the defaults it trains with; a run keeps its preset",
    )
    model: ModelConfig
    optim: OptimConfig = Field(default_factory=OptimConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    # A step's batch must fit in memory and in time; far beyond this one step already needs tens of
    # GiB of activations, and the value is recorded in run.toml, so every restart would repeat it.
    batch_size: int = Field(
        8,
        ge=1,
        le=MAX_STEP_SEQUENCES,
        description="sequences per optimizer step over the whole job (the global batch); grad_accum "
        "splits it into micro-batches, and each of a job's N ranks trains batch_size / (N x "
        "grad_accum) sequences per micro-batch, so the same config trains on the same batches at "
        "any world size; sizes that do not divide are refused, naming sizes that do",
    )
    grad_accum: int = Field(
        1,
        ge=1,
        le=MAX_STEP_SEQUENCES,
        description="micro-batches per optimizer step (one arm for all of them); it must divide "
        "batch_size, so at most batch_size",
    )
    batch_size_per: Literal["step"] | None = Field(
        None,
        description="what batch_size counts: 'step', written by every run this version creates; "
        "absent in runs created before, whose batch_size counted the sequences of one "
        "micro-batch (batch_size x grad_accum per step), and which keep that reading",
    )
    seed: int = Field(
        1337, ge=0, lt=SEED_LIMIT, description="seed of every random stream of the run"
    )
    mixing: Literal["fixed", "proxy"] = Field(
        "fixed",
        description="who chooses each step's data arm: the fixed mixture of the arms' weights, or "
        "andrea-proxy's bandit",
    )
    max_steps: int = Field(
        1000, ge=0, description="stop (with a checkpoint) after this many optimizer steps"
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where to train: auto = CUDA when available"
    )
    precision: Precision = Field(
        "auto",
        description="arithmetic of the training step (daemon/trainer/platform/precision.py): "
        "auto = bf16 autocast on a CUDA GPU that supports it (else tf32), fp32 on CPU",
    )
    deterministic: Literal["auto", "on", "off"] = Field(
        "auto",
        description="deterministic algorithms, cuBLAS workspace and math attention "
        "(daemon/trainer/platform/determinism.py); auto = on for CUDA, off on CPU",
    )
    threads: int | None = Field(
        None,
        ge=1,
        le=1024,  # 100,000 aborted the process in its thread pool (and were recorded in run.toml)
        description="torch intra-op threads (a bit-exact resume needs the same count); default: "
        "torch's choice",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile the training step's model: auto = on for CUDA, off on CPU",
    )
    eval: EvalConfig = Field(default_factory=EvalConfig)
    log_every: int = Field(10, ge=1, description="steps between progress lines")
    samples: SamplesConfig = Field(default_factory=SamplesConfig)
    export: ExportConfig | None = Field(
        None, description="what `andreactl export --format hf` writes in the model card"
    )

    TRAJECTORY_FIELDS: ClassVar[tuple[str, ...]] = (
        "model",
        "optim",
        "data",
        "batch_size",
        "seed",
        "mixing",
        "grad_accum",
        "batch_size_per",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        return upgrade_legacy(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _batch_divides(self) -> RunConfig:
        if self.batch_size_per == "step" and self.batch_size % self.grad_accum:
            raise ValueError(
                f"batch_size {self.batch_size} (sequences per optimizer step) is not divisible by "
                f"grad_accum {self.grad_accum}: "
                + divisible_choices(self.batch_size, self.grad_accum, "grad_accum")
            )
        if self.batch_size_per is None and self.batch_size * self.grad_accum > MAX_STEP_SEQUENCES:
            raise ValueError(
                f"batch_size {self.batch_size} x grad_accum {self.grad_accum} sequences per step "
                f"(this run counts batch_size per micro-batch) exceeds {MAX_STEP_SEQUENCES}"
            )
        return self

    def eval_every(self) -> int:
        """Steps between held-out evaluations as configured: `eval.every`, else the checkpoint
        cadence (0: never)."""
        return self.eval.every if self.eval.every is not None else self.checkpoint.every

    def trajectory(self) -> dict[str, Any]:
        """The settings that decide the training trajectory, as plain JSON data."""
        return trajectory_of(self.model_dump(mode="json"))

    def trajectory_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.trajectory()).encode()).hexdigest()


def trajectory_of(dump: dict[str, Any]) -> dict[str, Any]:
    """The trajectory settings of a config dump (as `RunConfig.trajectory`, for a dump read from a
    manifest or a file). Keys it lacks are left out."""
    traj = {k: dump[k] for k in RunConfig.TRAJECTORY_FIELDS if k in dump}
    if isinstance(traj.get("model"), dict):
        # Activation recompute changes how a step is computed, not one bit of it.
        traj["model"] = {
            k: v for k, v in traj["model"].items() if k not in ModelConfig.COMPUTE_ONLY
        }
    # Where tokenized data is cached changes nothing about the tokens themselves.
    if isinstance(traj.get("data"), dict):
        traj["data"] = {k: v for k, v in traj["data"].items() if k != "cache_dir"}
        # A bound on what is read refuses data; it never changes the tokens of data it accepts.
        traj["data"].pop("max_document_bytes", None)
        # Settings added after runs existed are left out at the value those runs implicitly had,
        # so that their hash, and so their resume, is unchanged.
        if traj["data"].get("heldout_fraction") in (None, 0.0):
            traj["data"].pop("heldout_fraction", None)
        if traj["data"].get("windows") in (None, "fixed"):
            traj["data"].pop("windows", None)
        if traj["data"].get("tokenizer") == "bytes":
            del traj["data"]["tokenizer"]
        if isinstance(traj["data"].get("arms"), list):
            # Which links an arm may follow changes no token (its identity names its files).
            traj["data"]["arms"] = [_arm_trajectory(a) for a in traj["data"]["arms"]]
    # Runs created before batch_size_per existed hash as they always did; with one micro-batch a
    # step both readings train the same batches.
    if traj.get("batch_size_per") is None or traj.get("grad_accum", 1) == 1:
        traj.pop("batch_size_per", None)
    if traj.get("grad_accum") == 1:
        del traj["grad_accum"]
    return traj


def _arm_trajectory(arm: Any) -> Any:
    if not isinstance(arm, dict):
        return arm
    # Which links an arm may follow changes no token (its identity names its files); settings
    # added after runs existed are left out unset, and dtype, once a default of every arm, is
    # "uint8" unset, so that those runs' hashes are unchanged. A tokens arm's identity names the
    # type its ids are read as, whoever says it (daemon/data/token_files.py).
    out = {
        k: v
        for k, v in arm.items()
        if not (k in ("field", "heldout_path") and v is None) and k != "links"
    }
    if out.get("dtype", "uint8") is None:
        out["dtype"] = "uint8"
    return out


def divisible_choices(total: int, divisor: int, name: str) -> str:
    """The values of `name` that divide `total`, and the nearest multiples of `divisor` around
    `total`: what a refusal of `total % divisor` offers instead."""
    fits = [d for d in range(1, total + 1) if total % d == 0]
    lower = total // divisor * divisor
    sizes = [s for s in (lower, lower + divisor) if 0 < s <= MAX_STEP_SEQUENCES]
    return (
        f"{name} {one_of(fits)} would work, or batch_size {one_of(sizes)}"
        if sizes
        else f"{name} {one_of(fits)} would work"
    )


def one_of(values: list[int]) -> str:
    """`1, 2 or 4`: the choices a refusal offers (the first twelve)."""
    shown = [str(v) for v in values[:12]] + (["..."] if len(values) > 12 else [])
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif (
        isinstance(value, list)
        and value
        and all(isinstance(v, dict) and "name" in v for v in value)
    ):
        # Lists of named items (the data arms) are compared by name, not by position.
        for v in value:
            _flatten({k: x for k, x in v.items() if k != "name"}, f"{prefix}.{v['name']}", out)
    else:
        out[prefix] = value


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every setting that differs between two config dumps, as `key: old → new` (an arm added or
    removed as `data.arms.NAME: added|removed`)."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(old, "", a)
    _flatten(new, "", b)
    out = []
    arms_a = {k.split(".")[2] for k in a if k.startswith("data.arms.")}
    arms_b = {k.split(".")[2] for k in b if k.startswith("data.arms.")}
    for name in sorted(arms_b - arms_a):
        out.append(f"data.arms.{name}: added")
    for name in sorted(arms_a - arms_b):
        out.append(f"data.arms.{name}: removed")
    gone = {f"data.arms.{n}." for n in arms_a ^ arms_b}
    for key in sorted(set(a) | set(b)):
        if any(key.startswith(g) for g in gone):
            continue
        was, now = _setting(a, key), _setting(b, key)
        if was != now:
            out.append(f"{key}: {was} → {now}")
    return out


def evaluation_changes(old: dict[str, Any], cfg: RunConfig) -> list[str]:
    """The held-out evaluation settings that differ between a config dump (a checkpoint's) and
    `cfg`, where they decide the mixture: under proxy mixing the evaluations reach the bandit in the
    loss records, and gated-plateau (the default reward of new runs), gated-fall and gated-heldout
    read them, so these operational settings change which arm a later step trains. [] under the
    fixed mixture, or for a dump written before evaluations had settings."""
    if cfg.mixing != "proxy" or not isinstance(old.get("eval"), dict):
        return []
    then = old["eval"]
    every_then = then.get("every")
    if every_then is None:
        every_then = old.get("checkpoint", {}).get("every")
    out = []
    if every_then != cfg.eval_every():
        out.append(f"evaluation every {every_then} steps → {cfg.eval_every()}")
    if then.get("sequences") != cfg.eval.sequences:
        out.append(f"eval.sequences: {then.get('sequences')} → {cfg.eval.sequences}")
    return out


#: Settings a trajectory leaves out at their value (`trajectory_of`): their absence means it.
_LEFT_OUT_AT = {"data.tokenizer": "bytes", "data.windows": "fixed"}


def _setting(flat: dict[str, Any], key: str) -> str:
    if key in flat:
        return _show(flat[key])
    return _LEFT_OUT_AT.get(key, "absent")


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


#: Presets. Parameter counts are pinned by tests: tiny ≈ 0.14M, 12m = 12.8M ± 2%, 120m ≈ 120M;
#: the GPT-3 paper's 1.3B and 6.7B shapes (Brown et al. 2020, table 2.1: layers, width, heads,
#: context 2,048, its batch in tokens and learning rates, no dropout) hold 1,213,845,504 and
#: 6,454,648,832 parameters under the byte vocabulary (the paper's 50,257-id vocabulary adds its
#: embedding and head). Their LR decays over Chinchilla's 20 tokens a parameter. Built on the
#: meta device where no memory holds them (`andreactl plan`, the tests).
PRESETS: dict[str, dict[str, Any]] = {
    "andrea-tiny": {
        "model": {"block_size": 64, "n_layer": 2, "n_head": 4, "n_embd": 64, "dropout": 0.1},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 20, "decay_steps": 2000},
        "batch_size": 8,
    },
    "andrea-12m": {
        "model": {"block_size": 256, "n_layer": 6, "n_head": 8, "n_embd": 416, "dropout": 0.1},
        "optim": {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 200, "decay_steps": 20000},
        "batch_size": 8,
    },
    "andrea-120m": {
        "model": {"block_size": 1024, "n_layer": 17, "n_head": 12, "n_embd": 768, "dropout": 0.0},
        "optim": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": 2000, "decay_steps": 200000},
        "batch_size": 8,
    },
    # 512 and 1,024 sequences: the paper's 1M and 2M tokens a step; warmup: its 375M tokens.
    "gpt3-1.3b": {
        "model": {"block_size": 2048, "n_layer": 24, "n_head": 16, "n_embd": 2048, "dropout": 0.0},
        "optim": {"lr": 2e-4, "min_lr": 2e-5, "warmup_steps": 360, "decay_steps": 23000},
        "batch_size": 512,
    },
    "gpt3-6.7b": {
        "model": {"block_size": 2048, "n_layer": 32, "n_head": 32, "n_embd": 4096, "dropout": 0.0},
        "optim": {"lr": 1.2e-4, "min_lr": 1.2e-5, "warmup_steps": 180, "decay_steps": 61500},
        "batch_size": 1024,
    },
}


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _blame_flags(flags: dict[str, Any] | None) -> Note:
    """An error in a value a command-line flag set is blamed on the flag."""

    def note(loc: tuple[Any, ...]) -> str:
        node: Any = flags or {}
        for part in loc:
            node = node.get(part) if isinstance(node, dict) else None
        return " (from the command line)" if node is not None else ""

    return note


#: The most a run config may hold: a few hundred lines, data arms included. A larger file, or
#: anything but a regular file (/dev/zero, a FIFO), is refused before it is read.
MAX_CONFIG_BYTES = 1 << 20


def load_toml(path: Path, *, follow_symlinks: bool = True) -> dict[str, Any]:
    """The TOML of a run config: a regular file of at most MAX_CONFIG_BYTES (through a link unless
    `follow_symlinks` is False: a tool reading another's run directory). ConfigError naming it."""
    try:
        return tomllib.loads(
            # utf-8-sig: an editor's byte-order mark is not a TOML statement.
            read_bounded(path, MAX_CONFIG_BYTES, follow_symlinks=follow_symlinks).decode(
                "utf-8-sig"
            )
        )
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except FileRejected as e:
        raise ConfigError(f"config file {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a run config") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None


def build_config(
    file_values: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    source: str = CONFIG_FILE,
) -> RunConfig:
    """Resolve preset ← file ← overrides into a validated RunConfig.

    The preset is looked up first (from overrides, then the file) so that a file only needs to say
    what differs from it.
    """
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        # Before the merge, so that a flag overrides the file's setting under its older name.
        file_values = upgrade_legacy(dict(file_values or {}))
        overrides = upgrade_legacy(overrides)
    except ValueError as e:
        raise ConfigError(f"invalid configuration ({source}): {e}") from None
    preset = overrides.get("preset", file_values.get("preset", "andrea-tiny"))
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    merged = _merge(_merge(PRESETS[preset], file_values), overrides)
    merged["preset"] = preset
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(
            describe(e, f"invalid configuration ({source})", _blame_flags(overrides))
        ) from None


def with_windows(cfg: RunConfig, unset: Windows | None) -> RunConfig:
    """`cfg` with `[data] windows` settled: as set, else `unset`: "shifted" for a new run (no
    checkpoint); for a run with checkpoints, what its newest one records, None (fixed windows)
    for one created before the setting, whose data order must not change under it."""
    if cfg.data.windows is not None or unset is None:
        return cfg
    data = cfg.data.model_copy(update={"windows": unset})
    return cfg.model_copy(update={"data": data})


def for_new_run(cfg: RunConfig) -> RunConfig:
    """The config a new run starts with: the default held-out split unless the config sets one,
    and batch_size counted per step. (An existing run whose run.toml has no split keeps none: it
    predates splits; one without batch_size_per keeps counting batch_size per micro-batch.)
    ConfigError when the batch does not divide under the new reading."""
    # Only what was set: a setting left open stays open (`[model] vocab_size`, which the run's
    # tokenizer then decides, daemon/data/open_settings.py), as it is for a run.toml of a new run.
    dump = cfg.model_dump(exclude_unset=True)
    if cfg.data.heldout_fraction is None:
        dump.setdefault("data", {})["heldout_fraction"] = DEFAULT_FRACTION
    dump["batch_size_per"] = "step"
    try:
        return RunConfig.model_validate(dump)
    except ValidationError as e:
        raise ConfigError(describe(e, "invalid configuration for a new run")) from None


def left_open(values: dict[str, Any], cfg: RunConfig) -> tuple[dict[str, Any], list[str]]:
    """What a new run's own config file (`values`, as a person wrote it) leaves open among the
    trajectory settings, filled in as this first start settled it (a flag, a preset's value, the
    held-out default, the tokenizer's vocabulary): the filled values, and each setting filled,
    `key = value` (`table.*` for a whole table). The resolved config records them, so that every
    restart trains under the same ones; the person's file is never rewritten."""
    values = json.loads(json.dumps(values, default=str))  # a copy, never the caller's
    dump = cfg.model_dump(mode="json", exclude_none=True)
    dump["data"].pop("cache_dir", None)
    recorded: list[str] = []
    for key in RunConfig.TRAJECTORY_FIELDS:
        if key in dump:  # a setting left unset (None) stays unset
            _fill_missing(values, key, dump[key], key, recorded)
    return values, recorded


def _fill_missing(
    into: dict[str, Any], key: str, value: Any, dotted: str, recorded: list[str]
) -> None:
    if key not in into:
        into[key] = value
        recorded.append(f"{dotted}.*" if isinstance(value, dict) else f"{dotted} = {_show(value)}")
    elif isinstance(value, dict) and isinstance(into[key], dict):
        for k, v in value.items():
            _fill_missing(into[key], k, v, f"{dotted}.{k}", recorded)


@dataclass(frozen=True)
class RunRecord:
    """A run's recorded config (`recorded_config`) and its person's file as that record last took
    it in (`APPLIED_CONFIG_FILE`; for a run directory of an earlier version, its run.toml, which
    was both)."""

    path: Path
    values: dict[str, Any]
    applied: dict[str, Any]

    def with_edits(self, now: dict[str, Any] | None, source: Path) -> dict[str, Any]:
        """The config values a start resolves from: the record, with what the person's file
        (`now`, None when there is none) changed since the record took it in. An unchanged file
        changes nothing (an accepted --allow-config-change stands); an edited key is taken, a
        removed one falls back to its default. A changed preset is refused: a run keeps its
        model."""
        if now is None:
            return dict(self.values)
        try:
            then, now = upgrade_legacy(dict(self.applied)), upgrade_legacy(dict(now))
            values = upgrade_legacy(dict(self.values))
        except ValueError as e:
            raise ConfigError(f"invalid configuration ({source}): {e}") from None
        was = values.get("preset", "andrea-tiny")
        if "preset" in now and now["preset"] != then.get("preset") and now["preset"] != was:
            raise ConfigError(
                f"{source} sets preset {now['preset']}, and this run (it has checkpoints) is "
                f"{was}: a run keeps its model; set it back, or start a new run directory"
            )
        return _apply_edits(values, then, now)


def _apply_edits(
    record: dict[str, Any], then: dict[str, Any], now: dict[str, Any]
) -> dict[str, Any]:
    out = dict(record)
    for key in then.keys() | now.keys():
        if key not in now:
            out.pop(key, None)
        elif then.get(key) == now[key]:
            continue
        elif all(isinstance(d.get(key), dict) for d in (then, now, out)):
            out[key] = _apply_edits(out[key], then[key], now[key])
        else:
            out[key] = now[key]
    return out


def read_record(run_dir: Path) -> RunRecord | None:
    """The run's recorded config (None before a first start recorded one). ConfigError naming
    the file when it cannot be read."""
    path = recorded_config(run_dir)
    if path is None:
        return None
    values = load_toml(path, follow_symlinks=False)
    if path.name == CONFIG_FILE:
        return RunRecord(path, values, values)
    applied = run_dir / APPLIED_CONFIG_FILE
    return RunRecord(path, values, load_toml(applied) if applied.is_file() else {})


def record_resolved(cfg: RunConfig, run_dir: Path, user_file: Path | None) -> None:
    """Record the config the run trains under (RESOLVED_CONFIG_FILE), and the person's file it
    took in, byte for byte (APPLIED_CONFIG_FILE; none when there is none). run.toml is written
    only where there is none, so that the run directory describes itself: a person's file is
    never rewritten. Atomically: the proxy, started at the same time, and the other ranks of a job
    may read them at any moment."""
    own = run_dir / CONFIG_FILE
    if not own.exists():
        save_config(cfg, own)
        user_file = user_file or own
    save_config(cfg, run_dir / RESOLVED_CONFIG_FILE)
    _record_applied(run_dir, user_file)


def _record_applied(run_dir: Path, user_file: Path | None) -> None:
    applied = run_dir / APPLIED_CONFIG_FILE
    if user_file is not None and user_file.is_file():
        atomic_write_bytes(applied, read_bounded(user_file, MAX_CONFIG_BYTES))
    else:
        applied.unlink(missing_ok=True)


def save_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as TOML at `path`, opening with what it is. Atomically."""
    _write_toml(path, cfg.model_dump(mode="json", exclude_none=True))


def record_trajectory(cfg: RunConfig, run_dir: Path, user_file: Path | None) -> None:
    """Make `cfg`'s trajectory settings those of the run's recorded config (after a change
    accepted with --allow-config-change), keeping its other settings, and take in the person's
    file as it is now; atomic and durable, so that the next plain restart runs under the
    accepted config. The person's run.toml is left as it is."""
    source = recorded_config(run_dir)
    values = load_toml(source, follow_symlinks=False) if source is not None else {}
    dump = cfg.model_dump(mode="json", exclude_none=True)
    cache_dir = (
        values.get("data", {}).get("cache_dir") if isinstance(values.get("data"), dict) else None
    )
    for key in RunConfig.TRAJECTORY_FIELDS:
        if key in dump:
            values[key] = dump[key]
        else:
            values.pop(key, None)
    values["data"] = {k: v for k, v in values["data"].items() if k != "cache_dir"}
    if cache_dir is not None:
        values["data"]["cache_dir"] = cache_dir
    _write_toml(run_dir / RESOLVED_CONFIG_FILE, values)
    _record_applied(run_dir, user_file)


def _write_toml(path: Path, values: dict[str, Any]) -> None:
    atomic_write_bytes(path, (run_toml_header(values) + tomli_w.dumps(values)).encode())


def run_toml_header(values: dict[str, Any]) -> str:
    """The comment run.toml opens with: what it is, and what its batch_size counts (the field's
    own description, or the older reading the run keeps)."""
    if values.get("batch_size_per") == "step":
        meaning = RunConfig.model_fields["batch_size"].description or ""
    else:
        meaning = (
            "sequences per micro-batch over the whole job (this run was created before "
            "batch_size counted a whole step, and keeps that reading: a step trains batch_size x "
            "grad_accum sequences)"
        )
    lines = textwrap.wrap(f"batch_size: {meaning}.", 96)
    return (
        "# The run's configuration, written by andrea-trainer; `andrea-trainer --help` describes\n"
        "# every setting.\n" + "".join(f"# {line}\n" for line in lines) + "\n"
    )
