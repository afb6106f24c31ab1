"""The Hub's and SlimPajama's files as a user brings them to a real trainer: a glob of Parquet
shards (``data/train-*.parquet``, several row groups each) and a ``.jsonl.zst`` chunk, in a
run.toml a person wrote. `--check` passes, the start counts every document and token, and a
SIGTERM then a resume ends bit for bit where the run never stopped does."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

from andrea.daemon.data.heldout import DEFAULT_FRACTION, is_held_out
from andrea.daemon.rundir.layout import bin_name
from tests.support import forkserver
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.owndata import hub_texts, write_hub, write_slim

STEPS = 30
RUN_TOML = """\
[[data.arms]]
name = "hub"
kind = "parquet"
paths = ["data/train-*.parquet"]

[[data.arms]]
name = "slim"
kind = "jsonl"
paths = ["slim/*.jsonl.zst"]
"""


def _train(run: Path, cache: Path) -> Daemon:
    return Daemon(trainer_cmd(run, cache, "--max-steps", str(STEPS), "--checkpoint-every", "15",
                              "--eval-every", "0"))  # fmt: skip


def _expected(ids: list[str], texts: list[str]) -> tuple[int, int]:
    """(documents held out, training tokens) under the byte-level tokenizer: the training
    documents' bytes joined by a blank line."""
    train = [t for d, t in zip(ids, texts, strict=True) if not is_held_out(d, DEFAULT_FRACTION)]
    return len(texts) - len(train), len("\n\n".join(train).encode())


def test_a_parquet_glob_and_a_jsonl_zst_train_count_and_resume_bit_exact(
    tmp_path: Path, cache_dir: Path
) -> None:
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    whole.mkdir()
    hub = write_hub(whole)
    slim = hub_texts(400, "slim")
    write_slim(whole / "slim" / "chunk_0.jsonl.zst", slim, frames=3)
    (whole / "run.toml").write_text(RUN_TOML)
    shutil.copytree(whole, stopped)

    res = forkserver.run(trainer_cmd(whole, cache_dir, "--check"), capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr

    t = _train(whole, cache_dir)
    assert t.wait(300) == 0, t.log
    hub_ids = [f"train-0000{s}-of-00002.parquet:{r}" for s in (0, 1) for r in range(1, 301)]
    slim_ids = [f"chunk_0.jsonl.zst:{r}" for r in range(1, 401)]
    for name, ids, texts in (("hub", hub_ids, hub), ("slim", slim_ids, slim)):
        held, tokens = _expected(ids, texts)
        line = re.search(
            rf"arm {name}: (\d+) of (\d+) documents held out .*?: ([\d,]+) training", t.log
        )
        assert line is not None, t.log
        assert (int(line[1]), int(line[2]), line[3]) == (held, len(texts), f"{tokens:,}")

    t = _train(stopped, cache_dir)
    t.wait_for(r"step (1[0-9]|2[0-5])/", timeout=300)
    t.signal(signal.SIGTERM)
    assert t.wait() == 0, t.log
    t = _train(stopped, cache_dir)
    assert t.wait(300) == 0, t.log
    resumed = re.search(r"resumed from step_(\d+)", t.log)
    assert resumed is not None and 10 <= int(resumed[1]) < STEPS, t.log
    assert "encoding arm" not in t.log
    assert (whole / bin_name(STEPS)).read_bytes() == (stopped / bin_name(STEPS)).read_bytes()
