"""A torchrun job whose cadences do not align: checkpoints, held-out evaluation, samples and progress
lines each on their own. Rank 0 alone samples and evaluates, but every rank must take the same
path through every step boundary: a rank that agrees once more while another trains pairs the
agreement's all-reduce with DDP's gradient all-reduce, and gloo aborts the job ("collective
mismatch"). That happened at the first sample step that was not a checkpoint step.

Real torchrun jobs of gloo ranks on CPU, at 2 and 3 ranks. The 3-rank job runs once to its
end, then resumes from its first cadence checkpoint in the same directory (the newer ones removed,
as if the machine had died right after writing it) and must end on the same bytes, the same loss
curve and the same samples. The 2-rank job runs past the same points, then is stopped by the one
thing only a rank's own look can find out (its token file replaced), as a job must stop: every
rank at one step. So is a job whose rank 0 cannot write a loss.

The 3-rank resume is also the proof of DDP's reduction order: its float sums depend on the order
in which the ranks' gradients are added, so a resume is bit-exact only if every step is reduced
in the same bucket layout as the run that was never stopped (daemon/trainer/parallel/ddp.py,
`finalize_ddp_buckets`). At two ranks a + b = b + a, and no layout can change a bit; at three
or more, gloo's ring all-reduce sums each element starting from the rank that owns the element's
segment of the bucket, so an element that moves in the bucket is summed in another order. The
negative control resumes the same checkpoint with the first-iteration layout
(`--unsafe-skip-restore buckets`) and must end on other bytes: the proof that these sums are
order-sensitive, and so that the test can fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, trainer_args
from tests.support.distributed import BIN

STEPS, RESUME = 15, 7
#: checkpoint 7, 14 (and 15, the end); evaluation 5, 10, 15; samples 3, 6, ...; a line every 2.
CADENCES = ("--checkpoint-every", "7", "--eval-every", "5", "--sample-every", "3")
CADENCES += ("--log-every", "2")
#: What the cadences are about is where they fall, not their size: an evaluation of 4 sequences
#: an arm and samples of 8 tokens (the defaults, 64 and 120, cost more than all the steps).
SMALL = "\n[eval]\nsequences = 4\n\n[samples]\nmax_new_tokens = 8\n"


def job(run_dir: Path, cache: Path, ranks: int, *extra: str) -> str:
    """The job to STEPS; its log (the test fails with it unless every rank ended cleanly)."""
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks)]
    cmd += ["--max-restarts", "0", "--no-python", str(BIN / "andrea-trainer")]
    cmd += trainer_args(run_dir, cache, "--max-steps", str(STEPS), *CADENCES)
    # A batch every world size shares: 6 sequences over 2 or 3 ranks.
    cmd += ["--batch-size", "6", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stderr


def samples(log: str, after: int) -> list[str]:
    return [
        line.split(" INFO ", 1)[1]
        for line in log.splitlines()
        if (m := re.search(r"INFO sample at step (\d+):", line)) and int(m.group(1)) > after
    ]


def curve(run_dir: Path) -> list[tuple[int, float, str]]:
    return [(e.step, e.loss, e.arm) for e in canonical_curve(read_entries(run_dir / ".loss.json"))]


def test_cadences_that_do_not_align_at_3_ranks_resume_bit_exact_in_the_same_bucket_layout(
    tmp_path: Path, cache_dir: Path
) -> None:
    run, control = tmp_path / "run", tmp_path / "control"
    run.mkdir()
    (run / "run.toml").write_text('batch_size_per = "step"\n' + SMALL)
    whole = job(run, cache_dir, 3)
    assert re.search(r"held-out loss at step 5:", whole), whole
    assert len(samples(whole, 0)) == 5 * 3  # steps 3, 6, 9, 12, 15; a sample per arm
    final, reference = (run / bin_name(STEPS)).read_bytes(), curve(run)
    for step in (14, STEPS):  # back to the cadence checkpoint of step 7
        (run / bin_name(step)).unlink()
        (run / manifest_name(step)).unlink()
    shutil.copytree(run, control, ignore=shutil.ignore_patterns(".sock", ".socket-dir", "*.lock"))
    resumed = job(run, cache_dir, 3)
    assert f"resumed from {bin_name(RESUME)}" in resumed, resumed
    assert (run / bin_name(STEPS)).read_bytes() == final
    assert curve(run) == reference
    assert samples(resumed, RESUME) == samples(whole, RESUME)

    log = job(control, cache_dir, 3, "--unsafe-skip-restore", "buckets")
    assert f"resumed from {bin_name(RESUME)}" in log, log
    assert (control / bin_name(STEPS)).read_bytes() != final


def test_cadences_that_do_not_align_at_2_ranks_then_a_data_change_stops_all_at_one_step(
    tmp_path: Path, cache_dir: Path
) -> None:
    """The same cadences past several points where they do not align, on a token file; then the
    file is replaced (a rename over it: the ranks' open files still read the old one, so only
    the step boundary's check can see it). Every rank stops at one step, agreed, with one
    checkpoint of it (daemon/data/livefiles.py)."""
    data = tmp_path / "mine.u16"
    (tmp_path / "run.toml").write_text(
        '[data]\nheldout_fraction = 0.3\n[[data.arms]]\nname = "mine"\nkind = "tokens"\n'
        'path = "mine.u16"\ndtype = "uint16"\n' + SMALL
    )
    ids = np.random.default_rng(0).integers(0, 256, 300_000).astype("<u2")
    ids.tofile(data)
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "0", "--no-python", str(BIN / "andrea-trainer")]
    cmd += trainer_args(tmp_path, cache_dir, "--max-steps", "100000", *CADENCES)
    t = Daemon(cmd, start_new_session=True)
    t.wait_for(r"\[rank 0\] INFO step 12/")
    ids[::-1].tofile(tmp_path / "new.u16")
    (tmp_path / "new.u16").replace(data)
    t.wait()
    assert re.search(r"held-out loss at step 10:", t.log) and "sample at step 9:" in t.log, t.log
    stops = set(re.findall(r"\[rank \d\] .*stopped at step (\d+) \(data-changed\)", t.log))
    assert len(stops) == 1 and t.log.count("INFO left the process group") == 2, t.log
    (step,) = stops
    # One checkpoint of that step: the stop's own, or the cadence's where it falls on that step
    # (every 7: CI stopped at 14 once), which the stop then finds written.
    ckpt = bin_name(int(step))
    own = f"checkpoint {ckpt} written (data-changed" in t.log
    cadence = f"checkpoint {ckpt} written (cadence" in t.log
    assert own or (cadence and f"step {step} is already checkpointed" in t.log), t.log
    assert (tmp_path / manifest_name(int(step))).exists(), t.log
    assert f"exitcode: {int(ExitCode.DATA_ERROR)}" in t.log and "exitcode: -6" not in t.log


def limit_file_size() -> None:
    """Writes past 4 KiB fail (EFBIG), as a full disk fails them (ENOSPC): the loss log fills at
    about step 19 (Python ignores SIGXFSZ once told to, and gets the error instead)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))


def test_a_loss_rank_0_cannot_record_stops_every_rank_at_one_step(
    tmp_path: Path, cache_dir: Path
) -> None:
    """Only rank 0 knows that a loss could not be written: it must still take the other ranks'
    path (train with them) until the next agreement carries its stop to them."""
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "0", "--no-python", str(BIN / "andrea-trainer")]
    cmd += trainer_args(tmp_path, cache_dir, "--max-steps", "60", "--checkpoint-every", "0")
    cmd += ["--eval-every", "0"]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size
    )
    log = res.stderr
    assert "cannot append the loss of step" in log, log
    stops = re.findall(
        r"\[rank \d\] INFO (?:stopped at|.*; stopped at) step (\d+) \(disk-full\)", log
    )
    assert len(stops) == 2 and len(set(stops)) == 1, log
    assert log.count("INFO left the process group") == 2, log  # a clean end of both ranks
    code = int(ExitCode.CHECKPOINT_FAILED)  # no final checkpoint without its loss; no abort
    assert f"exitcode: {code}" in log and "exitcode: -6" not in log, log
