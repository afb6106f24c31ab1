"""What ``andreactl status`` can say without asking a daemon: whether each daemon runs (its lock file),
and a summary of a stopped run from its files alone. Reads only; creates nothing.

A daemon holds an exclusive ``flock`` on ``RUN_DIR/.ROLE.lock`` for its whole life
(:func:`andrea.daemon.rundir.claim`), so a lock nobody holds means a stopped daemon, known at once,
with no socket, retry or timeout.
"""

from __future__ import annotations

import fcntl
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from andrea.daemon.evallog import last_eval
from andrea.daemon.metrics.series import ema_update
from andrea.daemon.rundir import EVAL_FILE, LOSS_FILE, STATE_FILE, lock_path, parse_checkpoint_name
from andrea.protocol.lineage import Lineage, WorldSpan
from andrea.protocol.lossentry import LossEntry

from .reports import CheckpointInfo, OfflineSummary

#: The loss EMA is computed from the tail of .loss.json: 256 KiB hold about 1,000 entries, and an
#: entry 1,000 steps back weighs 0.9**1000 (about 1e-46) in the EMA, below float64's resolution.
TAIL_BYTES = 256 * 1024


def daemon_running(run_dir: Path, role: str) -> bool:
    """Whether a process holds ``role``'s lock in ``run_dir`` (never creates the lock file)."""
    try:
        fd = os.open(lock_path(run_dir, role), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock taken here
    return False


def _lineage(manifest: dict) -> Lineage | None:
    """The manifest's lineage; one written before lineages were recorded: its own world size."""
    try:
        if manifest.get("lineage") is not None:
            return Lineage.model_validate(manifest["lineage"])
        size = int(manifest.get("environment", {}).get("world_size", 1))
        return Lineage(world_sizes=[WorldSpan(from_step=0, world_size=size)])
    except (ValueError, TypeError, AttributeError):
        return None


def _newest_checkpoint(
    run_dir: Path, now: datetime
) -> tuple[CheckpointInfo | None, int | None, Lineage | None]:
    manifests = sorted(
        (parsed[0], p)
        for p in run_dir.iterdir()
        if (parsed := parse_checkpoint_name(p.name)) is not None and parsed[1] == "json"
    )
    for step, path in reversed(manifests):
        try:
            data = json.loads(path.read_bytes())
            created = datetime.fromisoformat(data["created_utc"]).astimezone(UTC)
            phase = int(data["mixing"]["phase"])
            trigger = str(data["trigger"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged manifest is not a checkpoint; the older one is
        info = CheckpointInfo(
            step=step, trigger=trigger, created=created, age_seconds=(now - created).total_seconds()
        )
        return info, phase, _lineage(data)
    return None, None, None


def tail_entries(path: Path, max_bytes: int = TAIL_BYTES) -> list[LossEntry]:
    """The complete entries in the last ``max_bytes`` of a loss log, in file order (never modifies it)."""
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read()
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line may be cut
    out = []
    for line in lines:
        line = line.strip().rstrip(b",")
        if line.startswith(b"{") and line.endswith(b"}"):
            try:
                out.append(LossEntry.model_validate_json(line))
            except ValueError:
                continue  # a torn last line
    return out


def offline_summary(run_dir: Path, now: datetime | None = None) -> OfflineSummary:
    """Last checkpoint, logged step, segment, phase, loss EMA and policy of a run, from its files."""
    now = now or datetime.now(UTC)
    checkpoint, phase, lineage = _newest_checkpoint(run_dir, now)
    logged = segment = ema = None
    if (run_dir / LOSS_FILE).exists():
        newest: dict[int, LossEntry] = {}
        for e in tail_entries(run_dir / LOSS_FILE):
            if e.step not in newest or e.segment >= newest[e.step].segment:
                newest[e.step] = e
        for step in sorted(newest):
            ema = ema_update(ema, newest[step].loss)
        if newest:
            last = newest[max(newest)]
            logged, segment, phase = last.step, last.segment, last.phase
    fingerprint = None
    try:
        state = json.loads((run_dir / STATE_FILE).read_bytes())
        fingerprint = str(state["bandit"]["policy_fingerprint"])
        phase = int(state["bandit"]["phase"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # a fixed-mixture run has no bandit state
    evals = run_dir / EVAL_FILE
    return OfflineSummary(
        last_eval=last_eval(evals) if evals.exists() else None,
        last_checkpoint=checkpoint,
        logged_step=logged,
        segment=segment,
        phase=phase,
        loss_ema=ema,
        policy_fingerprint=fingerprint,
        lineage=lineage,
    )
