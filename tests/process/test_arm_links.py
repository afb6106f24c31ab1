"""Links among an arm's files: one that leaves the arm's directory and the run's is refused (exit 2)
before a byte of its target is read, by the trainer, `andreactl tokenizer train` and `encode`; one
that stays inside is followed; `links = "follow"` follows any, on purpose. The secret behind a
planted link (a real symlink to a 0600 file) never reaches tokenizer.json or the token cache."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from andrea.daemon.runtime.exitcodes import ExitCode

from ..support.daemons import trainer_cmd
from ..support.owndata import PROSE

SECRET = "hunter2-PRIVATE-KEY-" * 400
ARM = '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.md"]\n'


def _run(tmp_path: Path, links: str | None = None) -> Path:
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


def _unread(path: Path) -> bool:
    """Whether `path` was never read since the test set its access time to the epoch (always true
    where reads are not recorded)."""
    return path.stat().st_atime == 0


def test_the_trainer_refuses_a_link_out_of_the_arm(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "tokenizer.json").unlink(missing_ok=True)
    cache = tmp_path / "cache"
    cmd = trainer_cmd(run, cache, "--max-steps", "1")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "data: arm 'notes': " in res.stderr and "zz.md leads to" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert _unread(tmp_path / "secret.txt"), "the link's target was read"
    leaked = [p for p in cache.rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]
    assert not leaked, leaked
    # --check says so with the start's exit code.
    res = subprocess.run([*cmd, "--check"], capture_output=True, text=True, timeout=180)
    assert res.returncode == ExitCode.CONFIG_ERROR and "zz.md leads to" in res.stderr, res.stderr
