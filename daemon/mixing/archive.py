"""The archives of ended phases (`archive/pivot-*` in the run directory): writing one at a pivot,
reading the pivot records back, and late samples of an ended phase joining its archive.

An archive holds the ending phase's `.state.json` and `.samples.json` as they were at the pivot,
its policy, and the pivot record (`PIVOT_RECORD`): the boundary step, the old and new phase, both
policies' fingerprints and the time. The records are the one place the phases' starts are kept.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import tomli_w

from andrea.daemon.mixing.bandit import Bandit
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.mixing.proxyfiles import (
    MAX_SAMPLES_BYTES,
    MAX_STATE_BYTES,
    SampleRecord,
    SamplesFile,
    empty_samples,
    now_utc,
)
from andrea.daemon.rundir.boundedio import read_bounded, read_inside, read_json_inside
from andrea.daemon.rundir.durable import atomic_write_bytes
from andrea.daemon.rundir.layout import (
    MAX_PIVOT_RECORD_BYTES,
    PIVOT_RECORD,
    POLICY_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    pivot_archive,
    pivot_records,
)
from andrea.protocol import messages

log = logging.getLogger(__name__)


def write_archive(run_dir: Path, boundary: int, old: Bandit, policy: Policy) -> Path:
    """Archive the phase that `old` ran, ending after step `boundary`, with the record of the
    pivot to `policy`. Written from the live files and memory; nothing live is moved."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    archive = pivot_archive(run_dir, boundary, stamp)
    n = 1
    while archive.exists():  # a second pivot at the same step within the same second
        n += 1
        archive = pivot_archive(run_dir, boundary, f"{stamp}-{n}")
    archive.mkdir(parents=True)
    for name, limit in ((STATE_FILE, MAX_STATE_BYTES), (SAMPLES_FILE, MAX_SAMPLES_BYTES)):
        if (run_dir / name).exists():
            # Never through a link: the archive is exported as the run's own record.
            atomic_write_bytes(archive / name, read_bounded(run_dir / name, limit))
    atomic_write_bytes(
        archive / POLICY_FILE, tomli_w.dumps(old.policy.model_dump(mode="json")).encode()
    )
    record = {
        "boundary_step": boundary,
        "old_phase": old.phase,
        "new_phase": old.phase + 1,
        "old_policy": old.policy.fingerprint(),
        "new_policy": policy.fingerprint(),
        "utc": now_utc(),
    }
    atomic_write_bytes(archive / PIVOT_RECORD, json.dumps(record, indent=1).encode())
    return archive


def _read_record(run_dir: Path, record: Path) -> dict:
    """A pivot record, read where it lies and bounded (FileRejected, a ValueError, otherwise)."""
    return read_json_inside(run_dir, record.relative_to(run_dir), MAX_PIVOT_RECORD_BYTES)


def _pivot_records(run_dir: Path) -> list[tuple[Path, dict]]:
    out = []
    for record in pivot_records(run_dir):
        out.append((record.parent, _read_record(run_dir, record)))
    return out


def phase_starts(run_dir: Path) -> dict[int, int]:
    """Phase → the step after which it starts, from the pivot records under archive/."""
    return {int(d["new_phase"]): int(d["boundary_step"]) for _, d in _pivot_records(run_dir)}


def archive_of_phase(run_dir: Path, phase: int) -> Path | None:
    """The archive of the phase that ended at a pivot (the newest, should there be several)."""
    found = [(d["utc"], a) for a, d in _pivot_records(run_dir) if int(d["old_phase"]) == phase]
    return max(found)[1] if found else None


def last_pivot(run_dir: Path) -> tuple[int, int]:
    """(phase, boundary step) of the newest pivot recorded under archive/, or (0, 0)."""
    best = (0, 0)
    for record in pivot_records(run_dir):
        data = _read_record(run_dir, record)
        best = max(best, (int(data["new_phase"]), int(data["boundary_step"])))
    return best


def archive_samples(run_dir: Path, msg: messages.SampleReport) -> None:
    """Samples of a step of an ended phase that arrive after its pivot (re-sent by a trainer
    that was cut off from the proxy) join that phase's archive: the sample of a boundary
    belongs to the phase that ends there."""
    archive = archive_of_phase(run_dir, msg.phase)
    if archive is None:
        log.warning("samples of step %d: no archive of phase %d; not kept", msg.step, msg.phase)
        return
    path = archive / SAMPLES_FILE
    try:
        raw = read_inside(run_dir, path.relative_to(run_dir), MAX_SAMPLES_BYTES)
        kept = SamplesFile.model_validate_json(raw)
    except (OSError, ValueError):  # a ValidationError, or a file that is not a regular one
        kept = empty_samples()
    if kept.holds(msg.step, msg.segment):
        return
    kept.keep(SampleRecord.received(msg, arm_mix={}))
    kept.write(path)
    log.info("samples of step %d joined the archive of phase %d", msg.step, msg.phase)
