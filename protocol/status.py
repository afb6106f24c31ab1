"""What a daemon answers to a `status` request: one typed model per role.

The reply travels as ``Reply.data`` (a JSON object); the daemon builds it from the model below and
andreactl validates it back into the same model, so a field is added in one line here and both
sides see it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lineage import Lineage


class Activity(StrEnum):
    """What the trainer is doing now."""

    STARTING = "starting"
    TRAINING = "training"
    WAITING_FOR_PROXY = "waiting for proxy"
    #: Held after a boundary checkpoint until resumed (the first half of a pivot).
    HOLDING = "holding"
    #: Scoring the held-out sequences (a stop request abandons it at once).
    EVALUATING = "evaluating"
    STOPPING = "stopping"


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HoldState(StrEnum):
    PENDING = "pending"  # asked for; the trainer has not reached its boundary yet
    HOLDING = "holding"  # checkpointed at `step`, waiting for a resume naming this hold
    FAILED = "failed"  # the boundary checkpoint could not be written; nothing is held


class HoldStatus(_Status):
    """A pivot's hold on the trainer (see daemon/trainer/links/hold_registry.py): its identity, state and age."""

    id: str
    state: HoldState
    owner_pid: int | None  # the process that asked for it: the proxy running the pivot
    requested_at_step: int
    step: int | None  # the boundary, once holding
    age_s: float  # since holding (since the request while pending)
    acknowledged: bool  # the proxy has every record up to `step`: a pivot may start
    timeout_s: float
    error: str | None


class DataPreparation(_Status):
    """The arm a starting trainer is encoding into its token cache, and how far it is
    (daemon/data/encoding_progress.py)."""

    arm: str
    bytes_done: int = Field(description="read from the arm's files so far (for .gz: compressed)")
    bytes_total: int = Field(description="the arm's files' sizes")
    documents: int = Field(description="documents encoded so far")
    elapsed_seconds: float
    bytes_per_second: float | None = None
    eta_seconds: float | None = Field(None, description="to the arm's end at the rate so far")


class TrainerStatus(_Status):
    role: Literal["trainer"] = "trainer"
    pid: int  # in a torchrun job: global rank 0's, the process SIGUSR1 checkpoints through
    world_size: int = 1  # processes of the job (torchrun's WORLD_SIZE)
    agent_pid: int | None = None  # in a torchrun job: torchrun's (see docs/distributed.md)
    activity: Activity
    step: int
    max_steps: int
    loss_ema: float | None
    last_checkpoint: int | None
    segment: int  # with the proxy: 0 until the proxy has numbered this life's segment
    phase: int
    mixing: str
    proxy_connected: bool | None
    preset: str
    run_dir: str
    device: str | None  # None until the trainer has resolved it
    dtype: str | None
    # As of the last progress line; None until the first (and before any checkpoint, the age).
    tokens_per_second: float | None = None
    lr: float | None = None
    elapsed_seconds: float | None = Field(None, description="since this trainer life started")
    eta_seconds: float | None = Field(None, description="to max_steps at the recent step rate")
    last_checkpoint_age_seconds: float | None = None
    checkpoint_every: int = 0  # 0: every step is a boundary
    hold: HoldStatus | None = None
    grad_accum: int = 1
    compiled: bool | None = None  # None until the trainer has decided
    eval_every: int | None = None  # None until set up; 0: no held-out evaluation
    last_eval: EvalEntry | None = None
    #: The world sizes the run trained at and the checkpoint it started from (None until resumed).
    lineage: Lineage | None = None
    #: While the trainer starts: the arm being encoded into the token cache, and how far it is.
    preparing: DataPreparation | None = None


class Zombie(_Status):
    """An arm whose source is gone: it never draws, and its history stays in the bandit's state
    (see docs/bandit.md). The bandit reports these, `.state.json` keeps them, status shows them."""

    # Strict like the bandit's state: in `.state.json`, a coerced value ("3" for 3) or a non-finite
    # number means the file was edited or broken.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    name: str
    identity: str
    reason: str
    pulls: int
    ema_reward: float
    weight: float


class ArmReward(_Status):
    """One arm as the bandit sees it now (docs/bandit.md, "What the bandit reports")."""

    reward: float = Field(description="the arm's reward, in the units RewardReport.meaning names")
    loss: float | None = Field(
        description="recent training loss: EMA of the losses of the arm's own steps in the phase "
        "(about 10 of them); null before its first"
    )
    progress: float = Field(
        description="nats per step by which that EMA still sets new lows (the learnability "
        "rewards' measure, kept under every reward)"
    )
    pulls: int = Field(description="steps of the phase trained on the arm")


class RewardReport(_Status):
    """What the bandit rewards, and each arm's standing (live arms and zombies)."""

    kind: str = Field(
        description="the policy's reward: the name of one of the proxy's rewards, e.g. "
        "'gated-plateau' (docs/bandit.md lists them)"
    )
    meaning: str = Field(description="what the reward measures, in a few words")
    arms: dict[str, ArmReward]


class ProxyStatus(_Status):
    role: Literal["proxy"] = "proxy"
    durable_step: int
    max_segment: int
    phase: int
    phase_start_step: int
    lag: int
    probabilities: dict[str, float]
    zombies: list[Zombie]
    policy_fingerprint: str
    #: The progress of the newest trainer life, as its logged losses show (pivots are checked
    #: against it).
    trainer_step: int
    last_eval: EvalEntry | None = None
    #: None from a proxy older than the reward choice.
    reward: RewardReport | None = None
