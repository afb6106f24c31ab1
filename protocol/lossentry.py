"""The LossEntry record: one trained step, as the trainer sends it to the proxy and as the proxy
writes it, one per line, in the run's ``.loss.json`` (byte grammar in :mod:`andrea.daemon.rundir.losslog`)."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

#: The JSON spellings of a non-finite loss, and the values they stand for.
NON_FINITE_LOSSES = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


#: Bounds of the integer fields: a step (and so a segment or phase count) fits the checkpoint's
#: int32 header; tokens stay exact in a float64 column. A value past them is damage or a hostile peer.
MAX_STEP = 2**31 - 1
MAX_TOKENS = 2**53


def _decode_loss(value: Any) -> Any:
    # Only the three spellings the writer emits: a lax float parse would also take "nan" or "1.5",
    # and a hand-edited file should fail loudly rather than be half-understood.
    if isinstance(value, str):
        try:
            return NON_FINITE_LOSSES[value]
        except KeyError:
            raise ValueError(
                f"loss must be a number or one of {sorted(NON_FINITE_LOSSES)}, got {value!r}"
            ) from None
    return value


#: A held-out loss in a record: a number, or one of the non-finite spellings of a loss.
HeldoutLoss = Annotated[float, BeforeValidator(_decode_loss)]
#: The fields a record may leave out (absent from the JSON when they have no value).
OPTIONAL_FIELDS = frozenset({"heldout", "probe"})


class LossEntry(BaseModel):
    """One trained step, as written in ``.loss.json`` and sent from the trainer to the proxy.

    Strict: numbers must be plain Python ``int``/``float`` (use ``tensor.item()``, ``int(x)``).
    In JSON a non-finite ``loss`` is the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; in Python
    it is always a ``float``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, ser_json_inf_nan="strings")

    step: int = Field(
        ge=1,
        le=MAX_STEP,
        description="optimizer update this loss belongs to (the loss of update `step`)",
    )
    loss: Annotated[float, BeforeValidator(_decode_loss)] = Field(
        description="training loss; may be non-finite"
    )
    arm: str = Field(
        min_length=1, max_length=64, description="data source (bandit arm) of this step's batch"
    )
    lr: float = Field(ge=0.0, allow_inf_nan=False, description="learning rate used by this update")
    tokens: int = Field(ge=1, le=MAX_TOKENS, description="tokens in this step's batch")
    wall_time: float = Field(
        ge=0.0, allow_inf_nan=False, description="unix seconds when the step finished"
    )
    segment: int = Field(
        ge=1,
        le=MAX_STEP,
        description="the segment (numbered stretch of the trainer's records) that trained this step",
    )
    phase: int = Field(
        ge=0, le=MAX_STEP, description="bandit policy (pivot counter) this step trained under"
    )
    batch_sha256: str | None = Field(
        pattern=r"^[0-9a-f]{64}$", description="sha256 of the batch tokens, or null"
    )
    # Optional, and left out of the JSON when absent, so that the records of steps that follow no
    # evaluation (nearly all) keep the bytes they always had, and logs written before it stay valid.
    heldout: dict[Annotated[str, Field(min_length=1, max_length=64)], HeldoutLoss] | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="held-out loss per arm of the weights this step started from (those after "
        "update step - 1), when the trainer evaluated them; absent otherwise. Part of the record "
        "so that the bandit reads evaluations in the same ordered, durable stream as the losses",
    )
    # Only on the steps whose assignment asked for it (a policy with a target), left out otherwise.
    probe: dict[Annotated[str, Field(min_length=1, max_length=64)], HeldoutLoss] | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="loss per target arm on its small fixed probe of held-out sequences, of the "
        "weights after this step, when the proxy's assignment asked for it (the transfer reward "
        "reads it); absent otherwise",
    )
