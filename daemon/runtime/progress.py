"""What the trainer tells a person while it runs and when it ends: the progress line's ETA, its
structured journald fields, and the end-of-run summary.

Under systemd the progress line carries the fields ``STEP``, ``LOSS``, ``LR``, ``ARM`` and ``PHASE``
(passed as ``extra`` to logging; systemd's JournalHandler sends every record attribute as a journal
field), so that ``journalctl -u andrea-trainer@RUN STEP=1200`` finds a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The journal fields of a progress line, in order.
JOURNAL_FIELDS = ("STEP", "LOSS", "LR", "ARM", "PHASE")


def journal_fields(step: int, loss: float, lr: float, arm: str, phase: int) -> dict[str, str]:
    """The structured fields of the progress line of ``step`` (journald stores values as text)."""
    return {
        "STEP": str(step),
        "LOSS": f"{loss:.6g}",
        "LR": f"{lr:.6g}",
        "ARM": arm,
        "PHASE": str(phase),
    }


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``: two units at most, for a person."""
    if not math.isfinite(seconds):
        return "?"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def eta_seconds(step: int, max_steps: int, seconds_per_step: float) -> float:
    """Seconds to ``max_steps`` at ``seconds_per_step`` (0 when there)."""
    return max(0, max_steps - step) * seconds_per_step


@dataclass(frozen=True)
class RunSummary:
    """What one trainer life did, printed when it ends."""

    first_step: int  # the step it started after
    last_step: int
    wall_seconds: float
    tokens: int
    loss_ema: float | None
    checkpoints_written: int
    segment: int
    stopped_because: str

    def text(self) -> str:
        ema = "-" if self.loss_ema is None else f"{self.loss_ema:.4f}"
        restarts = max(0, self.segment - 1)
        trained = self.last_step - self.first_step
        steps = (
            f"steps {self.first_step + 1}-{self.last_step} ({trained} trained)"
            if trained
            else f"no step trained (at step {self.last_step})"
        )
        return (
            f"run summary: {steps} in {format_duration(self.wall_seconds)}, "
            f"{self.tokens:,} tokens, final loss EMA {ema}, {self.checkpoints_written} checkpoint(s) "
            f"written, segment {self.segment} ({restarts} restart(s) before it); {self.stopped_because}"
        )
