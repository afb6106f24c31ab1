"""A link that leaves an arm's directory and the run's, met by a real trainer: refused with exit 2
before a byte of its target is read (tests/unit/test_arm_links.py has the rules in-process)."""

from __future__ import annotations

from pathlib import Path

from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import trainer_cmd
from tests.support.links import linked_run, unread


def test_the_trainer_refuses_a_link_out_of_the_arm(tmp_path: Path) -> None:
    run = linked_run(tmp_path)
    (run / "tokenizer.json").unlink(missing_ok=True)
    cache = tmp_path / "cache"
    cmd = trainer_cmd(run, cache, "--max-steps", "1")
    res = forkserver.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "data: arm 'notes': " in res.stderr and "zz.md leads to" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert unread(tmp_path / "secret.txt"), "the link's target was read"
    leaked = [p for p in cache.rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]
    assert not leaked, leaked
    # --check says so with the start's exit code.
    res = forkserver.run([*cmd, "--check"], capture_output=True, text=True, timeout=180)
    assert res.returncode == ExitCode.CONFIG_ERROR and "zz.md leads to" in res.stderr, res.stderr
