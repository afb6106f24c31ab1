"""The EvalEntry record: one held-out evaluation, as the trainer sends it to the proxy and as
``.eval.json`` holds it, one per line (the byte grammar of :mod:`andrea.daemon.rundir.losslog`)."""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from andrea.protocol.lossentry import _decode_loss


class ArmEval(BaseModel):
    """One arm's held-out loss at one step."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, ser_json_inf_nan="strings")

    loss: Annotated[float, BeforeValidator(_decode_loss)] = Field(
        description="mean cross-entropy per token (nats) over the arm's evaluation sequences"
    )
    sequences: int = Field(ge=1, description="evaluation sequences scored")
    tokens: int = Field(ge=1, description="tokens scored")


class EvalEntry(BaseModel):
    """One evaluation, as the trainer sends it to the proxy and as ``.eval.json`` holds it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, ser_json_inf_nan="strings")

    step: int = Field(ge=1, description="the weights evaluated are those after update `step`")
    segment: int = Field(
        ge=1, description="the segment (numbered stretch of the trainer's records) that evaluated"
    )
    phase: int = Field(ge=0, description="bandit policy (pivot counter) in force at `step`")
    arms: dict[str, ArmEval] = Field(description="held-out loss per arm (arms with a split)")
    seconds: float = Field(ge=0.0, allow_inf_nan=False, description="wall time of the evaluation")
    wall_time: float = Field(
        ge=0.0, allow_inf_nan=False, description="unix seconds when it finished"
    )

    def mean_loss(self) -> float:
        """The mean over arms (each arm weighs the same, whatever its size)."""
        return sum(a.loss for a in self.arms.values()) / len(self.arms)

    def worst(self) -> tuple[str, float]:
        """The arm with the highest held-out loss (a NaN counts as highest), and that loss."""
        # A non-finite loss (a diverged arm) is the worst there is, NaN included.
        name = max(self.arms, key=lambda n: (math.isnan(self.arms[n].loss), self.arms[n].loss))
        return name, self.arms[name].loss
