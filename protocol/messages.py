"""Every ZeroMQ message between the trainer, the proxy and andreactl: one definition, validated.

Wire format: one JSON object per ZeroMQ frame (after the ROUTER's identity frame), tagged by
`type`, with a client-chosen `id` echoed in the reply so that a DEALER client can match replies to
requests and drop stale ones after a retry. Messages larger than MAX_MESSAGE_BYTES are refused at
the socket (ZMQ_MAXMSGSIZE) before they are parsed.

Link (trainer → proxy): hello (answered by welcome, or a refusing reply: another protocol version,
seed or arm set), assign (assignments), losses (loss_ack, once durable), eval (eval_ack), samples. Control
(andreactl → trainer): status, checkpoint, resume (a cancel), stop; (andreactl → proxy): status,
pivot. A pivot's exchange (proxy → trainer, on the trainer's control socket): hold (answered once
the trainer holds at its boundary), resume (carrying the new phase). Status replies carry the
models of :mod:`andrea.protocol.status`. Every request gets exactly one reply; an
invalid request gets a `reply` with ok=false and an error, and changes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.limits import MAX_SAMPLE_PROMPT, MAX_SAMPLES
from andrea.protocol.lossentry import MAX_STEP, LossEntry

MAX_MESSAGE_BYTES = 4 << 20
#: 2: a `hello` names its process (`pid`) and its life's secret (`life`).
PROTOCOL = 2
#: How the proxy's refusal of a record from a peer that is not the live trainer begins: a genuine
#: trainer whose socket the proxy does not know (a restarted proxy) says hello again at once.
UNKNOWN_PEER = "not the live trainer"
#: How the proxy's refusal of a `hello` begins while another trainer life is alive: a trainer
#: that started while the previous one was still exiting asks again for a while.
TRAINER_ALIVE = "another trainer is alive"
#: Steps, segments and phases fit the checkpoint's int32 header; a larger number is refused when
#: the message is parsed, before any handler sees it.
Count = Annotated[int, Field(ge=0, le=MAX_STEP)]
ArmName = Annotated[str, Field(min_length=1, max_length=64)]
#: One item of a pivot's target, verbatim as `andreactl pivot --target` took it: "ARM" or "ARM=W".
TargetItem = Annotated[str, Field(min_length=1, max_length=128)]


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(max_length=64)


# ---- link: trainer → proxy ------------------------------------------------------------------


class Hello(_Msg):
    """A trainer life introduces itself. `segment` is None for a new life (the proxy numbers its
    segment) and its segment's number when it reconnects after a proxy restart. A proxy of another
    `protocol` refuses it. `pid` and `life` (a secret the trainer process draws at start and sends only to
    the proxy) say which process speaks: a hello that is not the live life is refused while the
    live one runs (docs/protocol.md, "Who may speak for the trainer")."""

    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL
    segment: int | None = Field(None, ge=1, le=MAX_STEP)
    resume_step: Count
    seed: int = Field(ge=0, lt=2**63)
    arms: list[ArmName] = Field(max_length=1024)
    pid: int | None = Field(None, ge=1, lt=2**31)
    life: str | None = Field(None, min_length=16, max_length=64)


class PhaseStart(BaseModel):
    """Phase `phase` trains the steps after `after_step` (phase 0 starts after step 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    phase: int = Field(ge=0)
    after_step: int = Field(ge=0)


class Welcome(_Msg):
    type: Literal["welcome"] = "welcome"
    segment: int
    phase: int
    phase_start_step: int
    lag: int
    phases: list[PhaseStart] = Field(
        default_factory=list,
        description="every phase of the run so far, oldest first: a trainer that trained past a "
        "phase's start under an older phase rolls back to that start",
    )


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
    probe: list[ArmName] | None = Field(
        None,
        max_length=1024,
        exclude_if=lambda v: v is None,
        description="the target arms whose probe losses the step's record must carry, of the "
        "weights after the step (a phase with a target, every few steps); absent otherwise",
    )


class Assignments(_Msg):
    type: Literal["assignments"] = "assignments"
    items: list[Assignment]
    waiting_for_step: int | None = Field(
        None, description="when short: the step whose loss the next assignment needs"
    )
    phases: list[PhaseStart] = Field(
        default_factory=list, description="as in Welcome: a pivot is seen without a reconnect"
    )


class LossReport(_Msg):
    type: Literal["losses"] = "losses"
    entries: list[LossEntry] = Field(max_length=4096)


class LossAck(_Msg):
    """Sent only after the entries are durable (fsync'd) in .loss.json."""

    type: Literal["loss_ack"] = "loss_ack"
    keys: list[tuple[int, int]]  # (segment, step)


class EvalReport(_Msg):
    """One held-out evaluation; the proxy appends it to .eval.json."""

    type: Literal["eval"] = "eval"
    entry: EvalEntry


class EvalAck(_Msg):
    """Sent only after the entry is durable (fsync'd) in .eval.json."""

    type: Literal["eval_ack"] = "eval_ack"
    key: tuple[int, int]  # (segment, step)


#: The longest text of one sample, in characters.
MAX_SAMPLE_TEXT = 16384


class Sample(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prompt: str = Field(max_length=MAX_SAMPLE_PROMPT)
    text: str = Field(max_length=MAX_SAMPLE_TEXT)


class SampleReport(_Msg):
    type: Literal["samples"] = "samples"
    step: int = Field(ge=1, le=MAX_STEP)
    segment: int = Field(ge=1, le=MAX_STEP)
    phase: Count
    samples: list[Sample] = Field(max_length=MAX_SAMPLES)


# ---- control: andreactl → trainer or proxy --------------------------------------------------


class StatusRequest(_Msg):
    type: Literal["status"] = "status"


class CheckpointRequest(_Msg):
    """Checkpoint after the current step (or at the next cadence boundary); with `wait`, the reply
    comes once the checkpoint is durable."""

    type: Literal["checkpoint"] = "checkpoint"
    boundary: bool = False
    wait: bool = False


class HoldRequest(_Msg):
    """The proxy, running a pivot: checkpoint at the next cadence boundary and hold there. The
    reply comes once the trainer holds with every record up to the boundary acknowledged (`data`:
    `hold_id`, `step`), or says why it will not (another hold, a failed boundary checkpoint, a
    cancel, a stop). The request's `id` is the hold's identity: only a `resume` naming it releases
    the trainer. The trainer holds for one request at a time, and releases itself after
    `timeout_s` of holding without a resume (a proxy that died mid-pivot)."""

    type: Literal["hold"] = "hold"
    owner_pid: int | None = Field(
        None, ge=1, description="the requesting process (the proxy), shown in the trainer's status"
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        le=7 * 86400,
        description="once holding, the trainer releases itself after this long without a resume",
    )


class NewPhase(BaseModel):
    """The phase a pivot started, as the proxy tells the trainer when it releases it: phase
    `phase` trains the steps after `after_step` under the policy of fingerprint `policy`. (One
    more thing a new phase carries is one more optional field here.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)
    phase: int = Field(ge=1, le=MAX_STEP)
    after_step: int = Field(ge=0, le=MAX_STEP)
    policy: str = Field(pattern=r"^[0-9a-f]{64}$")


class ResumeRequest(_Msg):
    """Release the hold `hold_id` (or cancel it, if the trainer has not reached its boundary yet).
    With `new_phase` (the proxy, once it committed a pivot) the trainer takes the new phase as
    it resumes: its prefetched arms of the old phase are dropped, and the next ones come from the
    new phase. Without it (a cancel, a pivot given up) it asks the proxy again. A resume naming
    any other hold is refused and changes nothing."""

    type: Literal["resume"] = "resume"
    hold_id: str = Field(max_length=64)
    new_phase: NewPhase | None = None


class PivotRequest(_Msg):
    """Start a new bandit phase under the policy given as TOML text, at the trainer's next
    checkpoint boundary: the proxy holds the trainer there, commits the phase and releases the
    trainer with it, and answers once all that is done (docs/bandit.md, "The polish pivot").
    Instead of a policy text, a request may carry a `target` (items "ARM" or "ARM=W"): the new
    policy is then the one in force with that target and the transfer reward, made by the proxy
    (`policy.retargeted`), which owns the policy in force. Exactly one of the two.

    The proxy checks everything first (policy, arms, feasibility over the live arms, a policy
    identical to the running one, another pivot in progress) and a refused request changes
    nothing. With `dry_run` it only checks and describes (old → new bounds) at `boundary_step`;
    with `force` an identical policy still starts a new phase. The pivot is the proxy's from the
    moment it accepts it: its client may go away at any moment, the proxy carries it through or
    gives it up (after `timeout_s` without a boundary), and never leaves the trainer held."""

    type: Literal["pivot"] = "pivot"
    policy_toml: str | None = Field(None, max_length=65536)
    target: list[TargetItem] | None = Field(None, min_length=1, max_length=1024)
    boundary_step: int | None = Field(
        None, ge=1, le=MAX_STEP, description="a dry run's boundary (the trainer's next one)"
    )
    dry_run: bool = False
    force: bool = False
    timeout_s: float = Field(
        3600.0, gt=0, le=7 * 86400, description="give up unless the trainer holds within this"
    )
    hold_timeout_s: float = Field(
        600.0, gt=0, le=7 * 86400, description="the trainer's own release, as HoldRequest's"
    )

    @model_validator(mode="after")
    def _one_policy(self) -> PivotRequest:
        if (self.policy_toml is None) == (self.target is None):
            raise ValueError("a pivot carries either policy_toml or target, not both or neither")
        return self


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
    | EvalReport
    | EvalAck
    | SampleReport
    | StatusRequest
    | CheckpointRequest
    | HoldRequest
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
