"""The README's own-data example runs as written: its run.toml, verbatim, in a run directory holding
text, JSON Lines and books to pre-tokenize, and its three commands, verbatim, from a directory whose
`.venv` is this project's; the training command stopped with Ctrl-C after its first step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from andrea.daemon.data.corpus import stdlib_root
from andrea.daemon.rundir.losslog import read_entries
from tests.support.daemons import REPO, Daemon
from tests.support.owndata import write_jsonl


def _example() -> tuple[str, list[str]]:
    """The README's own-data run.toml and its shell commands."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Your own data") : text.index("### Exit codes")]
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    sh = re.search(r"```sh\n(.*?)```", section, re.S)
    assert toml and sh, "README.md's own-data example lost its run.toml or its commands"
    return toml.group(1), [line for line in sh.group(1).splitlines() if line.strip()]


def _data(run: Path) -> None:
    lib = stdlib_root()
    for i, name in enumerate(("textwrap", "shlex", "glob", "fnmatch", "string", "heapq")):
        path = run / "notes" / f"part{i % 2}" / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((lib / f"{name}.py").read_text())
    rows = [{"text": (lib / f"{n}.py").read_text()[:3000]} for n in ("csv", "uuid", "pprint")]
    write_jsonl(run / "web" / "part-000.jsonl.gz", rows * 10, gz=True)
    (run / "books").mkdir()
    for name in ("calendar", "gettext"):
        (run / "books" / f"{name}.txt").write_text((lib / f"{name}.py").read_text())


def test_the_own_data_example_runs_as_written(tmp_path: Path) -> None:
    toml, commands = _example()
    assert [c.split()[0:3] for c in commands] == [
        [".venv/bin/andreactl", "tokenizer", "train"],
        [".venv/bin/andreactl", "tokenizer", "encode"],
        [".venv/bin/andrea-trainer", "--run-dir", "runs/mine"],
    ]
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    run = tmp_path / "runs" / "mine"
    _data(run)
    (run / "run.toml").write_text(toml)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}  # the default cache, kept out of $HOME
    for command in commands[:2]:
        res = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True,
                             text=True, timeout=300, env={**os.environ, **env})  # fmt: skip
        assert res.returncode == 0, (command, res.stderr)
    made_by = json.loads((run / "books.u16.json").read_text())["tokenizer"]
    t = Daemon(["bash", "-c", "exec " + commands[2]], env=env, cwd=tmp_path)
    t.wait_for(r"model andrea-12m: .* starting at step 0", timeout=600)
    deadline = time.monotonic() + 600
    while not (run / ".loss.json").is_file() or not read_entries(run / ".loss.json"):
        assert t.proc.poll() is None and time.monotonic() < deadline, t.log
        time.sleep(0.2)
    t.signal(signal.SIGINT)  # Ctrl-C, once the first step is trained
    assert t.wait(600) == 0, t.log
    assert "held-out split: a new run" in t.log and "proxy stopped" in t.log, t.log
    (manifest,) = [json.loads(p.read_text()) for p in run.glob("step_*.json")]
    assert manifest["tokenizer"] == made_by and manifest["trigger"] == "sigint"
    assert manifest["model"]["vocab_size"] % 64 == 0
    assert {c["name"] for c in manifest["data"]} == {"notes", "web", "books"}
