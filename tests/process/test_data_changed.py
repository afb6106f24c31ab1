"""A token file changed under a live trainer (daemon/data/livefiles.py): truncated, then rewritten
in place. Each time the trainer stops with a checkpoint of the last step trained on the file as
it was opened, a log line naming the file, and exit DATA_ERROR; a restart onto the changed file is
refused (RESUME_REFUSED) unless told (--allow-config-change).

Before, a truncated file killed the trainer through its memory map (SIGBUS: no line, no
checkpoint), and ids rewritten at or above the vocabulary reached the embedding (IndexError,
exit 1). Real trainer processes, one run directory carried through the whole story.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, run_trainer, trainer_cmd

RUN_TOML = '[[data.arms]]\nname = "mine"\nkind = "tokens"\npath = "mine.u16"\ndtype = "uint16"\n'
TOKENS = 300_000
FOREVER = ("--max-steps", "100000", "--checkpoint-every", "0")


def stopped_at(log: str, file: Path, what: str) -> int:
    """The step the trainer stopped at for a change of `file`, from its line (which must say
    `what` changed)."""
    line = next(x for x in log.splitlines() if "changed under the run" in x)
    assert f"token file {file} changed under the run: {what}" in line, log
    assert f"exit {int(ExitCode.DATA_ERROR)}, not restarted" in line, log
    step = int(line.split("Stopping at step ")[1].split()[0])
    assert f"checkpoint {bin_name(step)} written (data-changed" in log, log
    return step


def drawn(run_dir: Path, step: int) -> int:
    """How many chunks the checkpoint of `step` says the arm gave since its cursor began."""
    (cursor,) = json.loads((run_dir / manifest_name(step)).read_text())["data"]
    return cursor["epoch"] * cursor["n_chunks"] + cursor["position"]


def test_a_token_file_changed_under_a_live_trainer_stops_it_with_a_checkpoint(
    tmp_path: Path, cache_dir: Path
) -> None:
    (tmp_path / "run.toml").write_text(RUN_TOML)
    data = tmp_path / "mine.u16"
    np.random.default_rng(0).integers(0, 256, TOKENS).astype("<u2").tofile(data)

    # Truncated: noticed at the next step boundary.
    t = Daemon(trainer_cmd(tmp_path, cache_dir, *FOREVER))
    t.wait_for(r"step 3/")
    os.truncate(data, TOKENS // 3 * 2)
    assert t.wait() == ExitCode.DATA_ERROR, t.log
    first = stopped_at(t.log, data, f"{2 * TOKENS:,} bytes when the run opened it")
    assert drawn(tmp_path, first) == 8 * first  # 8 sequences a step, nothing drawn past it

    res = run_trainer(tmp_path, cache_dir, "--max-steps", str(first + 1))
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "data arm 'mine'" in res.stderr and "--allow-config-change" in res.stderr

    # Told: the arm starts again from its beginning. Then its ids are rewritten in place at or
    # above the vocabulary, the modification time put back: found as the step reads them.
    t = Daemon(trainer_cmd(tmp_path, cache_dir, *FOREVER, "--allow-config-change"))
    t.wait_for(rf"step {first + 3}/")
    assert "arm 'mine' has changed data: its cursor starts at the beginning" in t.log
    st = data.stat()
    # Paused meanwhile: a step boundary between the write and the utime saw the new modification
    # time, and the trainer stopped for it instead of for the ids (a flake at a load of ~30).
    t.signal(signal.SIGSTOP)
    try:
        with data.open("r+b") as f:
            f.write(np.full(st.st_size // 2, 1000, dtype="<u2").tobytes())
        os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        t.signal(signal.SIGCONT)
    assert t.wait() == ExitCode.DATA_ERROR, t.log
    second = stopped_at(t.log, data, "it holds id 1,000, not below [model] vocab_size 256")
    assert drawn(tmp_path, second) == 8 * (second - first)
