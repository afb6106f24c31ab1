"""Reading metrics back as their users' tools do, for the metrics tests: TensorBoard's own event
reader, and the loss EMA the progress line and the exports carry, computed from the raw losses."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def ema_of(losses: list[float]) -> list[float]:
    ema, out = None, []
    for x in losses:
        ema = x if ema is None else 0.9 * ema + 0.1 * x
        out.append(ema)
    return out


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
