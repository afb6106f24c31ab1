"""An arm with a link out of it, for the tests of links among an arm's files: a run of one text
arm whose `notes/zz.md` links to a 0600 secret outside the run, and whether that secret was read."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.owndata import PROSE

SECRET = "hunter2-PRIVATE-KEY-" * 400


ARM = '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.md"]\n'


def linked_run(tmp_path: Path, links: str | None = None) -> Path:
    """A run of one text arm, and a 0600 file outside it that `notes/zz.md` links to."""
    run = tmp_path / "run"
    (run / "notes").mkdir(parents=True)
    for i in range(3):
        (run / "notes" / f"n{i}.md").write_text(PROSE * 30)
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    (run / "notes" / "zz.md").symlink_to(secret)
    os.utime(secret, (0, secret.stat().st_mtime))  # read once, and the access time says so
    (run / "run.toml").write_text(ARM + (f'links = "{links}"\n' if links else ""))
    return run


def unread(path: Path) -> bool:
    """Whether `path` was never read since the test set its access time to the epoch (always true
    where reads are not recorded)."""
    return path.stat().st_atime == 0
