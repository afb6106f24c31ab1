"""andreactl as an operator runs it: a real CLI process against real daemons."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from andrea.control.commands.conventions import EXIT_STOPPED
from andrea.control.reports import HistoryReport, RequestReport, StatusReport
from andrea.daemon.mixing.policy import NEW_RUN_REWARD
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.daemons import andreactl as ctl


def test_operator_session(tmp_path: Path, cache_dir: Path) -> None:
    t = Daemon(
        trainer_cmd(
            tmp_path, cache_dir, "--with-proxy", "--max-steps", "100000", "--checkpoint-every", "0"
        )
    )
    t.wait_for(r"step 10/")
    t.wait_for(r"step 12/")  # a progress line after a checkpoint-free stretch: rates are known

    res = ctl(tmp_path, "--json", "status")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    StatusReport.model_validate_json(res.stdout)
    assert status["state"] == "running" and status["offline"] is None
    assert status["trainer"]["activity"] == "training" and status["proxy"]["phase"] == 0
    live = status["trainer"]
    assert live["tokens_per_second"] > 0 and live["lr"] > 0 and live["elapsed_seconds"] > 0
    assert live["eta_seconds"] > 0 and live["last_checkpoint_age_seconds"] is None
    assert len(status["proxy"]["policy_fingerprint"]) == 64
    assert (status["trainer"]["device"], status["trainer"]["dtype"]) == ("cpu", "float32")
    assert abs(sum(status["proxy"]["probabilities"].values()) - 1) < 1e-12
    # A new run's reward, and each arm's standing under it.
    reward = status["proxy"]["reward"]
    assert (
        reward["kind"] == NEW_RUN_REWARD
        and reward["arms"].keys() == status["proxy"]["probabilities"].keys()
    )
    assert sum(a["pulls"] for a in reward["arms"].values()) > 0
    human = ctl(tmp_path, "status").stdout
    assert (
        "trainer: training, step" in human and "cpu float32" in human and "probabilities:" in human
    )
    assert f"reward: {NEW_RUN_REWARD}: {reward['meaning']}" in human and "train loss" in human
    assert "tok/s" in human and "ETA" in human and "elapsed" in human and "policy" in human

    res = ctl(tmp_path, "checkpoint", "--wait")
    assert res.returncode == 0 and "checkpoint step_" in res.stdout, res.stderr
    name = res.stdout.split("checkpoint ")[1].split()[0].rstrip(",")
    assert (
        json.loads((tmp_path / name.replace(".bin", ".json")).read_text())["trigger"] == "control"
    )

    proxy_pid = int((tmp_path / ".proxy.lock").read_text())
    res = ctl(tmp_path, "stop", "--wait", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    stopped = RequestReport.model_validate_json(res.stdout)
    assert stopped.ok and stopped.detail["exit_code"] == 0 and stopped.checkpoint
    # Issue 24, item 18: --wait means every process of the run has exited, the trainer that
    # started the proxy (--with-proxy) and the proxy included.
    assert t.proc.poll() is not None, "stop --wait returned while the trainer was still running"
    with pytest.raises(ProcessLookupError):
        os.kill(proxy_pid, 0)
    assert t.wait() == ExitCode.OK, t.log
    # Issue 24, item 17: stopping a stopped run is done, as with systemctl.
    again = ctl(tmp_path, "stop", "--json")
    assert again.returncode == 0 and RequestReport.model_validate_json(again.stdout).ok
    # Output: the two processes told apart, no "resuming after step 0", an ETA, a closing summary.
    lines = t.log.splitlines()
    assert any(" [proxy] INFO " in x for x in lines) and any(" [trainer] INFO " in x for x in lines)
    assert "resuming after step 0" not in t.log and "starting a fresh run" in t.log
    assert re.search(r"step 12/100000 \| .* \| ETA \d", t.log)
    assert re.search(
        r"run summary: steps 1-\d+ \(\d+ trained\) in .*checkpoint\(s\) written", t.log
    )

    # A refused start (another seed: a trajectory change without --allow-config-change) prints its
    # error last, after the proxy's closing lines.
    refused = forkserver.run(
        trainer_cmd(tmp_path, cache_dir, "--with-proxy", "--seed", "99"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == ExitCode.RESUME_REFUSED, refused.stderr
    out = refused.stderr.strip().splitlines()
    starts = [i for i, x in enumerate(out) if re.match(r"\d\d:\d\d:\d\d ", x)]
    # The last log record is the error; what follows it is its own continuation lines.
    assert "[trainer] ERROR" in out[starts[-1]], refused.stderr[-2000:]

    hist = HistoryReport.model_validate_json(
        ctl(tmp_path, "--json", "history", "--last", "0").stdout
    )
    assert [e.step for e in hist.rows] == list(range(1, len(hist.rows) + 1))
    assert len(hist.rows) >= 10
    res = ctl(tmp_path, "plot", "--out", str(tmp_path / "loss.svg"), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["steps"] == len(hist.rows)

    res = ctl(tmp_path, "status")
    assert res.returncode == EXIT_STOPPED and "stopped; last checkpoint step" in res.stdout


def test_size_and_unreachable_trainer(tmp_path: Path) -> None:
    res = ctl(None, "size", "--preset", "andrea-12m", "-o", "json")
    assert json.loads(res.stdout) == {
        "preset": "andrea-12m",
        "n_params": 12_812_800,
        "checkpoint_bytes": 8 + 12 * 12_812_800,
    }
    # --timeout bounds a --wait only (how long a durable checkpoint may take); a plain request
    # tries twice for 3 s. A trainer that holds no lock is known to be stopped: both forms say so
    # at once, without touching the run directory.
    res = ctl(tmp_path, "checkpoint")
    assert res.returncode == 1 and "not running" in res.stderr
    res = ctl(tmp_path, "checkpoint", "--wait", "--timeout", "1")
    assert res.returncode == 1 and "not running" in res.stderr
    assert list(tmp_path.iterdir()) == [], "asking a stopped run creates nothing"
