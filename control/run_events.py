"""The events of a run that an audit marks on its curve, read from the run directory alone.

- restarts: the first step of every trainer segment after the first (from the canonical curve);
- pivots: every ``archive/pivot-*/pivot.json`` (boundary step, phases, policy fingerprints);
- each phase's policy: the archived ``policy.toml`` of every ended phase and the bandit policy in
  ``.state.json`` for the running one;
- audit checkpoints: manifests whose trigger an operator asked for (SIGUSR1, control, boundary);
- zombies: every arm reported as a zombie in ``.state.json`` or an archived state, placed at the
  step after its last draw on the canonical curve (where it stopped training anything).

Read-only and tolerant: a missing or unreadable file drops its events (listed in ``problems``),
never the plot. Every file is read where it lies, bounded: a link below the run directory (to a file
or a directory) is unreadable, never followed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import TypeAdapter

from andrea.daemon.mixing.policy import MAX_POLICY_BYTES, Policy, PolicyError, parse_policy
from andrea.daemon.mixing.proxyfiles import MAX_STATE_BYTES
from andrea.daemon.rundir.boundedio import read_inside, read_json_inside
from andrea.daemon.rundir.layout import (
    MAX_MANIFEST_BYTES,
    MAX_PIVOT_RECORD_BYTES,
    POLICY_FILE,
    STATE_FILE,
    parse_checkpoint_name,
    pivot_records,
)
from andrea.daemon.rundir.losslog import LossCurve
from andrea.daemon.runtime.operator_requests import REQUESTED_TRIGGERS
from andrea.protocol.status import Zombie as ZombieReport


@dataclass(frozen=True)
class Pivot:
    step: int  # the boundary: the last step of the old phase
    phase: int  # the phase that starts after it
    policy_fingerprint: str  # of the new phase's policy


@dataclass(frozen=True)
class PhaseSpan:
    phase: int
    first_step: int
    last_step: int
    policy: Policy | None  # None when no file of the run records it


@dataclass(frozen=True)
class Zombie:
    step: int
    arm: str
    reason: str


@dataclass
class RunEvents:
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (first step, segment)
    pivots: list[Pivot] = field(default_factory=list)
    phases: list[PhaseSpan] = field(default_factory=list)
    audit_checkpoints: list[tuple[int, str]] = field(default_factory=list)  # (step, trigger)
    zombies: list[Zombie] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


_ZOMBIES = TypeAdapter(list[ZombieReport])


def _read_json(run_dir: Path, path: Path, limit: int) -> dict:
    """A JSON file of the run, read where it lies (never through a link) and bounded."""
    return read_json_inside(run_dir, path.relative_to(run_dir), limit)


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def restarts(curve: LossCurve) -> list[tuple[int, int]]:
    """(first step, segment) wherever the canonical curve's segment changes."""
    if len(curve) < 2:
        return []
    change = np.flatnonzero(curve.segment[1:] != curve.segment[:-1]) + 1
    return [(int(curve.step[i]), int(curve.segment[i])) for i in change]


def _pivot_records(run_dir: Path, problems: list[str]) -> list[tuple[dict, Path]]:
    records = []
    for path in sorted(pivot_records(run_dir)):
        try:
            data = _read_json(run_dir, path, MAX_PIVOT_RECORD_BYTES)
            int(data["boundary_step"]), int(data["new_phase"]), str(data["new_policy"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{path.relative_to(run_dir)}: unreadable ({e})")
            continue
        records.append((data, path.parent))
    return sorted(records, key=lambda r: int(r[0]["boundary_step"]))


def _archived_policy(run_dir: Path, archive: Path, problems: list[str]) -> Policy | None:
    path = archive / POLICY_FILE
    try:
        raw = read_inside(run_dir, path.relative_to(run_dir), MAX_POLICY_BYTES)
        return parse_policy(raw.decode("utf-8"), str(path))
    except (OSError, ValueError, PolicyError) as e:
        problems.append(f"{archive.name}/{POLICY_FILE}: {_first_line(e)}")
        return None


def _audit_checkpoints(run_dir: Path, problems: list[str]) -> list[tuple[int, str]]:
    manifests = []
    for path in run_dir.iterdir():
        parsed = parse_checkpoint_name(path.name)
        if parsed is not None and parsed[1] == "json":
            manifests.append((parsed[0], path))
    if not manifests:
        return []
    out = []
    for step, path in sorted(manifests):
        try:
            trigger = _read_json(run_dir, path, MAX_MANIFEST_BYTES)["trigger"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{path.name}: unreadable manifest ({_first_line(e)})")
            continue
        if isinstance(trigger, str) and trigger in REQUESTED_TRIGGERS:
            out.append((step, trigger))
    return out


def _zombies(
    run_dir: Path, curve: LossCurve, archives: list[Path], problems: list[str]
) -> list[Zombie]:
    reported: dict[str, str] = {}
    for state_path in [a / STATE_FILE for a in archives] + [run_dir / STATE_FILE]:
        if not state_path.exists() and not state_path.is_symlink():
            continue
        try:
            zombies = _ZOMBIES.validate_python(
                _read_json(run_dir, state_path, MAX_STATE_BYTES)["zombies"]
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{state_path.relative_to(run_dir)}: no zombie list ({_first_line(e)})")
            continue
        for z in zombies:
            reported.setdefault(z.name, z.reason)
    out = []
    for name, reason in sorted(reported.items()):
        drew = np.flatnonzero(curve.arm == name)
        # Never drawn on this curve: it was a zombie from the first step shown.
        step = (
            int(curve.step[drew[-1]]) + 1 if len(drew) else int(curve.step[0]) if len(curve) else 1
        )
        out.append(Zombie(step=step, arm=name, reason=reason))
    return out


def read_run_events(run_dir: Path, curve: LossCurve) -> RunEvents:
    """Every event of the run in ``run_dir`` that :mod:`andrea.control.plot` marks."""
    ev = RunEvents()
    ev.restarts = restarts(curve)
    records = _pivot_records(run_dir, ev.problems)
    ev.pivots = [
        Pivot(int(r["boundary_step"]), int(r["new_phase"]), str(r["new_policy"]))
        for r, _ in records
    ]
    ev.audit_checkpoints = _audit_checkpoints(run_dir, ev.problems)
    ev.zombies = _zombies(run_dir, curve, [a for _, a in records], ev.problems)

    current: Policy | None = None
    if (run_dir / STATE_FILE).exists() or (run_dir / STATE_FILE).is_symlink():
        try:
            state = _read_json(run_dir, run_dir / STATE_FILE, MAX_STATE_BYTES)
            current = Policy.model_validate(state["bandit"]["policy"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            ev.problems.append(f"{STATE_FILE}: no bandit policy ({_first_line(e)})")
    last = int(curve.step[-1]) if len(curve) else 0
    first = 1
    for r, archive in records:
        boundary = int(r["boundary_step"])
        ev.phases.append(
            PhaseSpan(
                int(r["old_phase"]),
                first,
                boundary,
                _archived_policy(run_dir, archive, ev.problems),
            )
        )
        first = boundary + 1
    phase_now = int(records[-1][0]["new_phase"]) if records else 0
    ev.phases.append(PhaseSpan(phase_now, first, max(first, last), current))
    return ev
