"""The run's ``.eval.json``: one entry per held-out evaluation, append-only, crash-safe, plain JSON.

Beside ``.loss.json`` and with exactly its guarantees (the byte grammar, torn-tail repair, O(1)
appends, one flock'd writer, never truncated or archived — see :mod:`andrea.daemon.losslog`), keyed
by (segment, step): an evaluation repeated after a restart is a new entry of the new segment, and
the canonical value of a step is the newest one (:func:`canonical_evals`). The proxy writes it;
in fixed-mixture mode, without a proxy, the trainer does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from .losslog import LossLog, last_entry, read_entries

_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _decode(value: Any) -> Any:
    # The three spellings the writer emits for a non-finite loss, as in .loss.json.
    if isinstance(value, str):
        try:
            return _NON_FINITE[value]
        except KeyError:
            raise ValueError(
                f"loss must be a number or one of {sorted(_NON_FINITE)}, got {value!r}"
            ) from None
    return value


class ArmEval(BaseModel):
    """One arm's held-out loss at one step."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, ser_json_inf_nan="strings")

    loss: Annotated[float, BeforeValidator(_decode)] = Field(
        description="mean cross-entropy per token (nats) over the arm's evaluation sequences"
    )
    sequences: int = Field(ge=1, description="evaluation sequences scored")
    tokens: int = Field(ge=1, description="tokens scored")


class EvalEntry(BaseModel):
    """One evaluation, as the trainer sends it to the proxy and as ``.eval.json`` holds it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, ser_json_inf_nan="strings")

    step: int = Field(ge=1, description="the weights evaluated are those after update `step`")
    segment: int = Field(ge=1, description="trainer process life that evaluated")
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
        """The arm with the highest held-out loss, and that loss."""
        name = max(self.arms, key=lambda n: self.arms[n].loss)
        return name, self.arms[name].loss


class EvalLog(LossLog):
    """The single writer of a ``.eval.json`` (see :class:`andrea.daemon.losslog.LossLog`)."""

    entry_type = EvalEntry


def read_evals(path: str | os.PathLike[str]) -> list[EvalEntry]:
    """Every complete entry, in file order; tolerates a torn tail, never modifies the file."""
    return read_entries(Path(path), EvalEntry)


def last_eval(path: str | os.PathLike[str]) -> EvalEntry | None:
    """The last complete entry, reading only the end of the file."""
    return last_entry(Path(path), EvalEntry)


def canonical_evals(entries: Iterable[EvalEntry]) -> list[EvalEntry]:
    """One entry per step, sorted by step: the newest (highest segment, then last in file order)."""
    newest: dict[int, EvalEntry] = {}
    for entry in entries:
        kept = newest.get(entry.step)
        if kept is None or entry.segment >= kept.segment:
            newest[entry.step] = entry
    return [newest[step] for step in sorted(newest)]
