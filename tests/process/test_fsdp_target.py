"""A target under FSDP. Rank 0 alone hears the proxy ask for a probe; the per-step agreement
carries the request to every rank with the step's arm, and every rank joins the probe's forward
pass (under FSDP an all-gather that no rank may skip). Two FSDP ranks, the proxy in the loop with
a policy that sets a target: the job ends, and its records carry a probe of both target arms every
PROBE_EVERY steps, as a single process's do (tests/process/test_target.py). Before the agreement
carried probes, an FSDP job skipped them with a warning and its records carried none."""

from __future__ import annotations

import math
import signal
import sys
from pathlib import Path

from andrea.daemon.mixing.rewards.transfer import PROBE_EVERY
from andrea.daemon.rundir.losslog import read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.process.test_target import POLICY
from tests.support.daemons import Daemon
from tests.support.distributed import STEPS, job, torchrun


def test_every_rank_joins_the_targets_probes_under_fsdp(tmp_path: Path, cache_dir: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.toml").write_text('preset = "andrea-tiny"\n')  # the proxy reads the arms in it
    (tmp_path / "target.toml").write_text(POLICY)
    proxy = Daemon([sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(run),
                    "--policy", str(tmp_path / "target.toml")])  # fmt: skip
    t = job(torchrun(run, cache_dir, "--mixing", "proxy", "--strategy", "fsdp"))
    assert t.wait(timeout=300) == ExitCode.OK, t.log
    proxy.signal(signal.SIGTERM)
    assert proxy.wait() == ExitCode.OK, proxy.log
    assert f"target probes: {STEPS // PROBE_EVERY}," in t.log, t.log
    probes: dict[int, dict[str, float]] = {}
    for e in read_entries(run / ".loss.json"):
        if e.probe is not None:
            probes.setdefault(e.step, e.probe)
    assert sorted(probes) == list(range(PROBE_EVERY, STEPS + 1, PROBE_EVERY)), probes
    for step, probe in probes.items():
        assert set(probe) == {"code", "comments"}, (step, probe)
        assert all(math.isfinite(v) and v > 0 for v in probe.values()), (step, probe)
