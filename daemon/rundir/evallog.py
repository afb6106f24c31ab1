"""The run's ``.eval.json``: one entry per held-out evaluation, append-only, crash-safe, plain JSON.

Beside ``.loss.json`` and with exactly its guarantees (the byte grammar, torn-tail repair, O(1)
appends, one flock'd writer, never truncated or archived — see :mod:`andrea.daemon.rundir.losslog`), keyed
by (segment, step): an evaluation repeated after a restart is a new entry of the new segment, and
the canonical value of a step is the newest one (:func:`canonical_evals`). The proxy writes it;
in fixed-mixture mode, without a proxy, the trainer does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from andrea.daemon.rundir.losslog import LossLog, last_entry, read_entries
from andrea.protocol.evalentry import ArmEval, EvalEntry

__all__ = ["ArmEval", "EvalEntry", "EvalLog", "canonical_evals", "last_eval", "read_evals"]


class EvalLog(LossLog):
    """The single writer of a ``.eval.json`` (see :class:`andrea.daemon.rundir.losslog.LossLog`)."""

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
