"""What ``andreactl status`` can say without asking a daemon: whether each daemon runs (its lock file),
which processes a stop ends, and a summary of a stopped run from its files alone. Reads only;
creates nothing.

A daemon holds an exclusive ``flock`` on ``RUN_DIR/.ROLE.lock`` for its whole life
(:func:`andrea.daemon.rundir.layout.claim`), so a lock nobody holds means a stopped daemon, known at once,
with no socket, retry or timeout.
"""

from __future__ import annotations

import errno
import fcntl
import os
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from andrea.control.reports import CheckpointInfo, OfflineSummary
from andrea.daemon.metrics.series import ema_update
from andrea.daemon.mixing.proxyfiles import MAX_STATE_BYTES
from andrea.daemon.rundir.boundedio import (
    FileRejected,
    open_regular,
    read_bounded,
    read_json,
    regular_size,
)
from andrea.daemon.rundir.evallog import last_eval
from andrea.daemon.rundir.layout import (
    EVAL_FILE,
    LOSS_FILE,
    MAX_MANIFEST_BYTES,
    STATE_FILE,
    bin_name,
    lock_path,
    parse_checkpoint_name,
)
from andrea.daemon.rundir.losslog import LossLogError
from andrea.daemon.runtime.validation_messages import first_problem
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lineage import Lineage, WorldSpan
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.status import RewardReport

#: The loss EMA is computed from the tail of .loss.json: 256 KiB hold about 1,000 entries, and an
#: entry 1,000 steps back weighs 0.9**1000 (about 1e-46) in the EMA, below float64's resolution.
TAIL_BYTES = 256 * 1024


def daemon_running(run_dir: Path, role: str) -> bool:
    """Whether a process holds ``role``'s lock in ``run_dir`` (never creates the lock file)."""
    # Non-blocking, and never through a link: a FIFO or a planted link is no daemon's lock, and
    # must not hang or mislead status.
    try:
        fd = os.open(lock_path(run_dir, role), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except (FileNotFoundError, IsADirectoryError):
        return False
    except OSError as e:
        if e.errno == errno.ELOOP:
            return False
        raise
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


def daemon_pid(run_dir: Path, role: str) -> int | None:
    """The pid a running ``role`` daemon wrote into its lock; None when none runs (or the lock
    holds no pid yet)."""
    if not daemon_running(run_dir, role):
        return None
    try:
        return int(read_bounded(lock_path(run_dir, role), 32))
    except (OSError, ValueError):
        return None


def run_processes(run_dir: Path) -> dict[str, int]:
    """Role → pid of each process that a stop of the trainer ends: the trainer, and the proxy when
    the trainer started it (``--with-proxy``: the proxy is its child). A proxy of its own (its own
    unit) outlives a stop of the trainer, so it is not listed."""
    trainer = daemon_pid(run_dir, "trainer")
    if trainer is None:
        return {}
    found = {"trainer": trainer}
    proxy = daemon_pid(run_dir, "proxy")
    if proxy is not None and _parent_pid(proxy) == trainer:
        found["proxy"] = proxy
    return found


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie waiting for its parent has)."""
    try:
        return _proc_stat(pid)[0] not in "ZX"
    except (OSError, IndexError, ValueError):
        return False


def lock_holder(run_dir: Path, role: str) -> int | None:
    """The pid of the process that holds ``role``'s lock, as the kernel lists it (/proc/locks),
    never the pid written in the file (a copy of a run carries its original's); None when no
    process of this pid namespace holds it."""
    try:
        st = os.stat(lock_path(run_dir, role), follow_symlinks=False)
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2154883 0 EOF" (a waiter's line has "->" first)
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode:
            pid = int(fields[4]) if fields[4].isdigit() else 0
            return pid or None  # 0: a process of another pid namespace
    return None


def process_paused(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger): it exists, holds what it holds,
    and runs nothing until SIGCONT."""
    try:
        return _proc_stat(pid)[0] in "Tt"
    except (OSError, IndexError, ValueError):
        return False


def _parent_pid(pid: int) -> int | None:
    try:
        return int(_proc_stat(pid)[1])
    except (OSError, IndexError, ValueError):
        return None


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


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
            data = read_json(path, MAX_MANIFEST_BYTES)
            created = datetime.fromisoformat(data["created_utc"]).astimezone(UTC)
            phase = int(data["mixing"]["phase"])
            trigger = str(data["trigger"])
            # A cheap look, not a verification (status must answer at once beside a 1.4 GB
            # payload): a checkpoint whose payload is gone or cut is not the resume point.
            if regular_size(run_dir / bin_name(step)) != data["bin_size"]:
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a damaged manifest is not a checkpoint; the older one is
        info = CheckpointInfo(
            step=step, trigger=trigger, created=created, age_seconds=(now - created).total_seconds()
        )
        return info, phase, _lineage(data)
    return None, None, None


def tail_entries(path: Path, max_bytes: int = TAIL_BYTES) -> list[LossEntry]:
    """The complete entries in the last ``max_bytes`` of a loss log, in file order (never modifies it).
    FileRejected when it is not a regular file (a link, a FIFO, ...)."""
    with os.fdopen(open_regular(path), "rb") as f:
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


def _logged(run_dir: Path, problems: list[str]) -> tuple[LossEntry | None, float | None]:
    """The newest canonical entry of the loss log's tail, and the loss EMA there."""
    path = run_dir / LOSS_FILE
    try:
        entries = tail_entries(path)
    except FileNotFoundError:
        return None, None
    except (OSError, FileRejected) as e:
        problems.append(f"{path}: {e}")
        return None, None
    newest: dict[int, LossEntry] = {}
    for entry in entries:
        if entry.step not in newest or entry.segment >= newest[entry.step].segment:
            newest[entry.step] = entry
    ema = None
    for step in sorted(newest):
        ema = ema_update(ema, newest[step].loss)
    return (newest[max(newest)] if newest else None), ema


def _last_eval(run_dir: Path, problems: list[str]) -> EvalEntry | None:
    try:
        return last_eval(run_dir / EVAL_FILE)
    except FileNotFoundError:
        return None
    except (OSError, LossLogError) as e:
        problems.append(str(e))
        return None


def _bandit_view(
    run_dir: Path, problems: list[str]
) -> tuple[str | None, int | None, RewardReport | None]:
    """The policy fingerprint, phase and reward report of the proxy's last ``.state.json``; all
    None for a fixed-mixture run (no state) and an unreadable one. The reward is None too in a
    state written before the reward could be chosen (no ``live_reward``)."""
    try:
        state = read_json(run_dir / STATE_FILE, MAX_STATE_BYTES)
        fingerprint = str(state["bandit"]["policy_fingerprint"])
        phase = int(state["bandit"]["phase"])
    except (OSError, ValueError, KeyError, TypeError):
        return None, None, None
    try:
        report = state.get("live_reward")
        return fingerprint, phase, None if report is None else RewardReport.model_validate(report)
    except ValidationError as e:
        problems.append(f"{run_dir / STATE_FILE}: live_reward: {first_problem(e)}")
        return fingerprint, phase, None


def offline_summary(run_dir: Path, now: datetime | None = None) -> OfflineSummary:
    """Last checkpoint, logged step, segment, phase, loss EMA and policy of a run, from its files.
    A file that cannot be read (a link, a FIFO, garbage) is named in ``problems``, never fatal."""
    now = now or datetime.now(UTC)
    problems: list[str] = []
    checkpoint, phase, lineage = _newest_checkpoint(run_dir, now)
    last, ema = _logged(run_dir, problems)
    if last is not None:
        phase = last.phase
    fingerprint, bandit_phase, reward = _bandit_view(run_dir, problems)
    return OfflineSummary(
        last_eval=_last_eval(run_dir, problems),
        last_checkpoint=checkpoint,
        logged_step=last.step if last else None,
        segment=last.segment if last else None,
        phase=phase if bandit_phase is None else bandit_phase,
        loss_ema=ema,
        policy_fingerprint=fingerprint,
        reward=reward,
        lineage=lineage,
        problems=problems,
    )
