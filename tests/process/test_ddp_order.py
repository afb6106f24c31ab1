"""Four ranks: DDP's float sums depend on the order in which the ranks' gradients are added, so a
resume is bit-exact only if every step is reduced in the same bucket layout as the run that was
never stopped (daemon/trainer/parts.py, `finalize_ddp_buckets`).

At two ranks a + b = b + a, and no layout can change a bit; at four, gloo's ring all-reduce sums
each element starting from the rank that owns the element's segment of the bucket, so an element
that moves in the bucket is summed in another order. The negative control resumes the same
checkpoint with the first-iteration layout (`--unsafe-skip-restore buckets`) and must end on other
bytes: the proof that these sums are order-sensitive, and so that the test can fail.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from andrea.daemon.rundir.layout import bin_name
from tests.support.daemons import trainer_args

BIN = Path(sys.executable).parent
RANKS = 4
STOP, STEPS = 1, 3


def four_ranks(run_dir: Path, cache: Path, steps: int, *extra: str) -> str:
    """A torchrun job of four CPU ranks (gloo) to `steps`, checkpointed only at its end; its log."""
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(RANKS)]
    cmd += ["--max-restarts", "0", "--no-python", str(BIN / "andrea-trainer")]
    cmd += trainer_args(run_dir, cache, "--max-steps", str(steps), "--checkpoint-every", "0")
    res = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stderr


def test_four_ranks_resume_bit_exact_in_the_same_bucket_layout(
    tmp_path: Path, cache_dir: Path
) -> None:
    whole, stopped, control = tmp_path / "whole", tmp_path / "stopped", tmp_path / "control"
    four_ranks(whole, cache_dir, STEPS)
    four_ranks(stopped, cache_dir, STOP)
    shutil.copytree(stopped, control)

    log = four_ranks(stopped, cache_dir, STEPS)
    assert f"resumed from {bin_name(STOP)}" in log, log
    final = (whole / bin_name(STEPS)).read_bytes()
    assert (stopped / bin_name(STEPS)).read_bytes() == final

    four_ranks(control, cache_dir, STEPS, "--unsafe-skip-restore", "buckets")
    assert (control / bin_name(STEPS)).read_bytes() != final
