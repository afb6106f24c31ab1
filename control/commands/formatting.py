"""How commands write figures for a person: a duration, a byte count, an evaluation on one line,
the bandit's reward report as a table."""

from __future__ import annotations

from andrea.daemon.runtime.progress import format_duration
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.status import RewardReport


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


def reward_lines(
    report: RewardReport,
    zombies: frozenset[str] = frozenset(),
    source: str = "",
    explained: frozenset[str] = frozenset(),
) -> list[str]:
    """The reward in force and what it means (``source``: where the report comes from, when not
    live; the meaning is left out when it is among ``explained``, said already), then per arm its
    reward, recent training loss (the EMA of its own steps' losses in the phase), progress and
    steps in the phase."""
    width = max([len("arm"), *(len(n) + 9 for n in zombies), *map(len, report.arms)])
    meaning = "" if report.meaning in explained else f": {report.meaning}"
    lines = [
        f"reward: {report.kind}{f' ({source})' if source else ''}{meaning}",
        f"{'arm':<{width}} {'reward':>8} {'train loss':>10} {'progress':>9} {'phase steps':>11}",
    ]
    for name, a in report.arms.items():
        label = f"{name} (zombie)" if name in zombies else name
        loss = "-" if a.loss is None else f"{a.loss:.4f}"
        lines.append(
            f"{label:<{width}} {a.reward:>8.4g} {loss:>10} {a.progress:>9.3g} {a.pulls:>11,}"
        )
    return lines
