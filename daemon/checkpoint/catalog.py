"""What checkpoints a run directory holds, and which of them may be pruned.

Read-only except `prune`. Audit checkpoints (SIGUSR1, `andreactl checkpoint`, pivot boundaries)
are kept by retention forever — at andrea-120m each is ~1.4 GB — so the operator needs to see them
(trigger, size, age, whether they verify) and remove the ones no longer wanted. A prune never
removes the newest intact checkpoint (the resume point) or a pivot boundary (the point a manual
pivot rolls back to, and the archive's reference) unless told to explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from andrea.daemon.checkpoint.manager import checkpoint_steps, verify_checkpoint
from andrea.daemon.rundir import layout as rundir
from andrea.daemon.rundir.boundedio import parse_json, read_inside, read_json, regular_size


@dataclass(frozen=True)
class Entry:
    step: int
    trigger: str
    bytes: int
    created_utc: str | None
    #: "ok" (size and sha256 match), "size ok" (not hashed), or the reason it is damaged.
    state: str
    pivot_boundary: bool

    @property
    def intact(self) -> bool:
        return self.state in ("ok", "size ok")

    def age_seconds(self, now: datetime) -> float | None:
        created = _utc_time(self.created_utc)
        return None if created is None else (now - created).total_seconds()


def _utc_time(value: object) -> datetime | None:
    """A manifest's `created_utc`, or None when it is not a time with its zone: a damaged
    manifest's fields are shown, never trusted."""
    try:
        created = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return created if created is not None and created.tzinfo is not None else None


def pivot_boundaries(run_dir: Path) -> set[int]:
    """Steps after which a pivot started a phase (from archive/*/pivot.json)."""
    out = set()
    for record in rundir.pivot_records(run_dir):
        try:
            rel = record.relative_to(run_dir)
            raw = read_inside(run_dir, rel, rundir.MAX_PIVOT_RECORD_BYTES)
            out.add(int(parse_json(raw, record)["boundary_step"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def _quick(run_dir: Path, step: int) -> tuple[dict, str]:
    man = read_json(run_dir / rundir.manifest_name(step), rundir.MAX_MANIFEST_BYTES)
    size = regular_size(run_dir / rundir.bin_name(step))
    if size != man["bin_size"]:
        return man, f"payload is {size} bytes, manifest says {man['bin_size']}"
    return man, "size ok"


def inventory(
    run_dir: Path, verify: bool = True, progress: Callable[[int, int, int], None] | None = None
) -> list[Entry]:
    """Every checkpoint with a manifest, newest first. `verify` hashes each payload (slow for big
    models: `progress(i, n, step)` is called before each)."""
    steps = checkpoint_steps(run_dir)
    boundaries = pivot_boundaries(run_dir)
    out = []
    for i, step in enumerate(steps):
        if progress is not None:
            progress(i, len(steps), step)
        man: dict = {}
        try:
            man, state = _quick(run_dir, step)
            if verify and state == "size ok":
                verify_checkpoint(run_dir, step)
                state = "ok"
        except (OSError, ValueError, KeyError, TypeError) as e:
            state = f"damaged: {e}"
        try:
            size = (run_dir / rundir.bin_name(step)).lstat().st_size
        except OSError:
            size = 0
        out.append(
            Entry(
                step=step,
                trigger=str(man.get("trigger", "?"))[:40],
                bytes=size,
                created_utc=man["created_utc"] if _utc_time(man.get("created_utc")) else None,
                state=state,
                pivot_boundary=step in boundaries,
            )
        )
    return out


@dataclass(frozen=True)
class Plan:
    remove: list[Entry]
    #: step → why it is kept.
    keep: dict[int, str]


def plan_prune(
    entries: Iterable[Entry],
    keep_latest: int,
    steps: set[int] | None = None,
    boundaries: bool = False,
    newest: bool = False,
) -> Plan:
    """Which checkpoints a prune removes: all but the newest `keep_latest` intact ones (or only
    `steps`), never the newest intact one unless `newest`, never a pivot boundary unless
    `boundaries`, never a damaged one (its files are evidence; the trainer reports and skips it,
    so it does not count among the kept: a run keeps `keep_latest` it can resume from)."""
    entries = sorted(entries, key=lambda e: e.step, reverse=True)
    newest_intact = next((e.step for e in entries if e.intact), None)
    keep: dict[int, str] = {}
    remove = []
    kept_intact = 0
    for e in entries:
        if steps is not None and e.step not in steps:
            keep[e.step] = "not named"
        elif steps is None and e.intact and kept_intact < keep_latest:
            kept_intact += 1
            keep[e.step] = f"among the newest {keep_latest} intact"
        elif not e.intact:
            keep[e.step] = "damaged (left for inspection)"
        elif e.step == newest_intact and not newest:
            keep[e.step] = (
                "newest intact checkpoint (the resume point; --include-newest removes it)"
            )
        elif e.pivot_boundary and not boundaries:
            keep[e.step] = "pivot boundary (--include-boundaries removes it)"
        else:
            remove.append(e)
    return Plan(remove, keep)


def prune(run_dir: Path, plan: Plan) -> int:
    """Remove the planned checkpoints, manifest first (a half-removed checkpoint must look absent,
    never valid); returns the bytes freed."""
    freed = 0
    for e in plan.remove:
        for name in (rundir.manifest_name(e.step), rundir.bin_name(e.step)):
            path = run_dir / name
            try:
                freed += path.lstat().st_size
                path.unlink()
            except FileNotFoundError:
                continue
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return freed


def now_utc() -> datetime:
    return datetime.now(UTC)
