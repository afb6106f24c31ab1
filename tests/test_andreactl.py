"""andreactl as an operator runs it: a real CLI process against real daemons."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from andrea.daemon.exitcodes import ExitCode

from .conftest import Trainer, trainer_cmd


def ctl(run_dir: Path | None, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    pre = ["--run-dir", str(run_dir)] if run_dir else []
    return subprocess.run(
        [sys.executable, "-m", "andrea.control.andreactl", *pre, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_operator_session(tmp_path: Path, cache_dir: Path) -> None:
    t = Trainer(
        trainer_cmd(
            tmp_path, cache_dir, "--with-proxy", "--max-steps", "100000", "--checkpoint-every", "0"
        )
    )
    t.wait_for(r"step 10/")

    res = ctl(tmp_path, "--json", "status")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert status["trainer"]["activity"] == "training" and status["proxy"]["phase"] == 0
    assert (status["trainer"]["device"], status["trainer"]["dtype"]) == ("cpu", "float32")
    assert abs(sum(status["proxy"]["probabilities"].values()) - 1) < 1e-12
    human = ctl(tmp_path, "status").stdout
    assert (
        "trainer: training, step" in human and "cpu float32" in human and "probabilities:" in human
    )

    res = ctl(tmp_path, "checkpoint", "--wait")
    assert res.returncode == 0 and "checkpoint step_" in res.stdout, res.stderr
    name = res.stdout.split("checkpoint ")[1].split()[0].rstrip(",")
    assert (
        json.loads((tmp_path / name.replace(".bin", ".json")).read_text())["trigger"] == "control"
    )

    res = ctl(tmp_path, "stop", "--wait")
    assert res.returncode == 0 and "exit_code 0" in res.stdout, res.stdout + res.stderr
    assert t.wait() == ExitCode.OK, t.log

    hist = json.loads(ctl(tmp_path, "--json", "history", "--last", "0").stdout)
    assert [e["step"] for e in hist] == list(range(1, len(hist) + 1)) and len(hist) >= 10
    res = ctl(tmp_path, "plot", "--out", str(tmp_path / "loss.svg"))
    assert res.returncode == 0, res.stderr
    svg = ElementTree.parse(tmp_path / "loss.svg").getroot()
    (line,) = [e for e in svg.iter() if e.tag.endswith("polyline")]
    assert len(line.get("points").split()) == len(hist)

    res = ctl(tmp_path, "status")
    assert res.returncode == 1 and "not running" in res.stdout


def test_size_and_unreachable_trainer(tmp_path: Path) -> None:
    res = ctl(None, "--json", "size", "--preset", "andrea-12m")
    assert json.loads(res.stdout) == {
        "preset": "andrea-12m",
        "n_params": 12_812_800,
        "checkpoint_bytes": 8 + 12 * 12_812_800,
    }
    res = ctl(tmp_path, "checkpoint", "--timeout", "1")
    assert res.returncode == 1 and "does not answer" in res.stderr
