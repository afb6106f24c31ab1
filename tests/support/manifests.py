"""A checkpoint manifest edited and re-signed (so that its content hash holds), for the tests of
what a resume checks behind the hash; and what a final checkpoint's trigger may be."""

from __future__ import annotations

import json
from pathlib import Path

from andrea.daemon.rundir.layout import manifest_name
from tests.support.hostile import resign


def edit_manifest(run_dir: Path, step: int, edit) -> None:
    path = run_dir / manifest_name(step)
    man = json.loads(path.read_text())
    edit(man)
    path.write_text(json.dumps(resign(man)))


def move_cursor(m: dict, i: int, field: str) -> None:
    """Move cursor `i` on by one position (within its arm) or one epoch."""
    c = m["data"][i]
    c[field] = (c[field] + 1) % c["n_chunks"] if field == "position" else c[field] + 1


def final_trigger_is(trigger: str, man: dict, log: str) -> bool:
    """Whether the final checkpoint `man` was written for `trigger`, or is the cadence
    checkpoint of the very step the stop landed on: then the stop has nothing to add, and the
    trainer's `log` says so."""
    return man["trigger"] == trigger or (
        man["trigger"] == "cadence" and f"step {man['step']} is already checkpointed" in log
    )
