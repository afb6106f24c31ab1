"""What an export may copy from a run directory: regular files that lie inside it, nothing else.

Whoever can write a run directory can plant a link in it (`policy.toml -> /etc/shadow`), and the
operator who exports is often root: an export that followed it would copy a file its planter could
never read into a folder anyone may read. So every file an export reads is looked at where it lies
(lstat, never its target), the export is refused before anything is written when one of them is a
link, a FIFO, a device or a socket, and the copy itself opens each file without following a link
anywhere below the run directory (:func:`andrea.daemon.rundir.boundedio.open_inside`), so a file swapped for
a link after the look is refused, not followed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePath

from andrea.daemon.rundir.boundedio import irregular
from andrea.daemon.rundir.layout import (
    ARCHIVE_DIR,
    CONFIG_FILE,
    LOSS_FILE,
    POLICY_FILE,
    RESOLVED_CONFIG_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    parse_checkpoint_name,
)

#: The run's own files in the audit trail, beside every file under archive/.
AUDIT_FILES = (LOSS_FILE, POLICY_FILE, STATE_FILE, SAMPLES_FILE)


def offenders(run_dir: Path) -> list[str]:
    """``NAME: what it is`` for each file an export would read that is not a regular file inside
    ``run_dir``: the config, the audit files, every checkpoint file and everything under archive/."""
    out = []
    names = [CONFIG_FILE, RESOLVED_CONFIG_FILE, *AUDIT_FILES]
    names += sorted(p.name for p in run_dir.iterdir() if parse_checkpoint_name(p.name))
    for name in names:
        kind = _kind(run_dir / name)
        if kind is not None:
            out.append(f"{name}: {kind}")
    archive = run_dir / ARCHIVE_DIR
    if _kind(archive) not in (None, "a directory"):
        out.append(f"{ARCHIVE_DIR}: {_kind(archive)}")
    elif archive.exists():
        _, bad = _walk(run_dir, PurePath(ARCHIVE_DIR))
        out += bad
    return out


def audit_sources(run_dir: Path) -> list[PurePath]:
    """The audit trail's files that exist, relative to ``run_dir``: the audit files, then every
    regular file under archive/ in sorted order (links and directories reached through one are
    left out: :func:`offenders` names them)."""
    found = [PurePath(n) for n in AUDIT_FILES if (run_dir / n).exists() and not _kind(run_dir / n)]
    if _kind(run_dir / ARCHIVE_DIR) == "a directory":
        files, _ = _walk(run_dir, PurePath(ARCHIVE_DIR))
        found += files
    return found


def _kind(path: Path) -> str | None:
    """What lies at ``path`` when it is not a regular file; None for a regular file or nothing."""
    try:
        return irregular(path)
    except FileNotFoundError:
        return None


def _walk(run_dir: Path, rel: PurePath) -> tuple[list[PurePath], list[str]]:
    """(regular files, offenders) under the real directory ``run_dir/rel``, never through a link."""
    files: list[PurePath] = []
    bad: list[str] = []
    with os.scandir(run_dir / rel) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                more, worse = _walk(run_dir, rel / entry.name)
                files += more
                bad += worse
            elif stat.S_ISREG(mode):
                files.append(rel / entry.name)
            else:
                bad.append(f"{rel / entry.name}: {irregular(Path(entry.path))}")
    return files, bad
