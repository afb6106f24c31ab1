"""Every ZeroMQ message between the trainer, the proxy and andreactl: one definition, validated.

Wire format: one JSON object per ZeroMQ frame (after the ROUTER's identity frame), tagged by
`type`, with a client-chosen `id` echoed in the reply so that a DEALER client can match replies to
requests and drop stale ones after a retry. Messages larger than MAX_MESSAGE_BYTES are refused at
the socket (ZMQ_MAXMSGSIZE) before they are parsed.

Link (trainer → proxy): hello, assign, losses, samples.  Control (andreactl → either): status,
checkpoint, stop. Every request gets exactly one reply; an invalid request gets an `error` reply and
changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from .lossentry import MAX_STEP, LossEntry

MAX_MESSAGE_BYTES = 4 << 20
PROTOCOL = 1
#: Steps, segments and phases fit the checkpoint's int32 header; a larger number is refused when
#: the message is parsed, before any handler sees it.
Count = Annotated[int, Field(ge=0, le=MAX_STEP)]
ArmName = Annotated[str, Field(min_length=1, max_length=64)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(max_length=64)


# ---- link: trainer → proxy ------------------------------------------------------------------


class Hello(_Msg):
    """A trainer life introduces itself. `segment` is None for a new life (the proxy numbers it)
    and the life's number when it reconnects after a proxy restart."""

    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL
    segment: int | None = Field(None, ge=1, le=MAX_STEP)
    resume_step: Count
    seed: int = Field(ge=0, lt=2**63)
    arms: list[ArmName] = Field(max_length=1024)


class Welcome(_Msg):
    type: Literal["welcome"] = "welcome"
    segment: int
    phase: int
    phase_start_step: int
    lag: int


class AssignRequest(_Msg):
    """Arms for steps from_step .. from_step + count - 1 (the proxy answers as many as it can)."""

    type: Literal["assign"] = "assign"
    segment: int = Field(ge=1, le=MAX_STEP)
    from_step: int = Field(ge=1, le=MAX_STEP)
    count: int = Field(ge=1, le=4096)


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    step: int
    arm: str
    phase: int


class Assignments(_Msg):
    type: Literal["assignments"] = "assignments"
    items: list[Assignment]
    waiting_for_step: int | None = Field(
        None, description="when short: the step whose loss the next assignment needs"
    )


class LossReport(_Msg):
    type: Literal["losses"] = "losses"
    entries: list[LossEntry] = Field(max_length=4096)


class LossAck(_Msg):
    """Sent only after the entries are durable (fsync'd) in .loss.json."""

    type: Literal["loss_ack"] = "loss_ack"
    keys: list[tuple[int, int]]  # (segment, step)


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt: str = Field(max_length=1024)
    text: str = Field(max_length=16384)


class SampleReport(_Msg):
    type: Literal["samples"] = "samples"
    step: int = Field(ge=1, le=MAX_STEP)
    segment: int = Field(ge=1, le=MAX_STEP)
    phase: Count
    samples: list[Sample] = Field(max_length=64)


# ---- control: andreactl → trainer or proxy --------------------------------------------------


class StatusRequest(_Msg):
    type: Literal["status"] = "status"


class CheckpointRequest(_Msg):
    """Checkpoint after the current step (or at the next cadence boundary); with `wait`, the reply
    comes once the checkpoint is durable. With `hold` the trainer then waits for `resume` (the
    first half of a pivot)."""

    type: Literal["checkpoint"] = "checkpoint"
    boundary: bool = False
    wait: bool = False
    hold: bool = False


class ResumeRequest(_Msg):
    """Release a trainer held after a boundary checkpoint; it drops its prefetched arms and asks
    the proxy again (the phase may have changed)."""

    type: Literal["resume"] = "resume"


class PivotRequest(_Msg):
    """Start a new bandit phase after `boundary_step` under the policy given as TOML text."""

    type: Literal["pivot"] = "pivot"
    policy_toml: str = Field(max_length=65536)
    boundary_step: int = Field(ge=1, le=MAX_STEP)


class StopRequest(_Msg):
    type: Literal["stop"] = "stop"
    wait: bool = False


class Reply(_Msg):
    """The answer to a control request (and to anything invalid)."""

    type: Literal["reply"] = "reply"
    ok: bool
    error: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


Message = Annotated[
    Hello
    | Welcome
    | AssignRequest
    | Assignments
    | LossReport
    | LossAck
    | SampleReport
    | StatusRequest
    | CheckpointRequest
    | ResumeRequest
    | PivotRequest
    | StopRequest
    | Reply,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def encode(msg: _Msg) -> bytes:
    return msg.model_dump_json().encode()


def decode(frame: bytes) -> Message:
    """Parse one frame. Raises pydantic.ValidationError (or ValueError) for anything invalid."""
    return _ADAPTER.validate_json(frame)
