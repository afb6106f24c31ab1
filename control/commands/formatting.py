"""How commands write figures for a person: a duration, a byte count, an evaluation on one line."""

from __future__ import annotations

from andrea.daemon.progress import format_duration
from andrea.protocol.evalentry import EvalEntry


def ago(seconds: float | None) -> str:
    """A duration, or "-" when it is unknown."""
    return "-" if seconds is None else format_duration(seconds)


def human_bytes(n: float) -> str:
    """A byte count in decimal units (``1.5 MB``)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def eval_text(e: EvalEntry) -> str:
    """One evaluation record on one line."""
    arms = ", ".join(f"{n} {a.loss:.4f}" for n, a in e.arms.items())
    return (
        f"step {e.step}: mean {e.mean_loss():.4f}, worst {e.worst()[0]} ({arms}; {e.seconds:.2f} s)"
    )
