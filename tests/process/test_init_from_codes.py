"""`--init-from` exit codes (issue 33, B13): every refusal of the source itself is the command
line's (2), whether its path, its manifest or its payload is wrong; only a run directory holding
another run's checkpoints is 4 (docs/distributed.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import trainer_cmd

TOKENS_ARM = '[[data.arms]]\nname = "pre"\nkind = "tokens"\npath = "pre.u16"\ndtype = "uint16"\n'


def _run(run: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    if not (run / "run.toml").exists():
        run.mkdir(parents=True, exist_ok=True)
        (np.arange(20_000) % 256).astype("<u2").tofile(run / "pre.u16")
        (run / "run.toml").write_text(TOKENS_ARM)
    cmd = trainer_cmd(run, cache, "--device", "cpu", "--mixing", "fixed", "--max-steps", "2",
                      "--checkpoint-every", "2", *extra)  # fmt: skip
    return forkserver.run(cmd, capture_output=True, text=True, timeout=300)


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_refusal_of_the_source_is_exit_2(tmp_path: Path, cache_dir: Path) -> None:
    res = _run(tmp_path / "base", cache_dir)
    assert res.returncode == 0, res.stderr
    base = tmp_path / "base"

    def garbage(d: Path) -> None:
        (d / manifest_name(2)).write_text("{")

    def middle(d: Path) -> None:
        _flip(d / bin_name(2), (d / bin_name(2)).stat().st_size // 2)

    cases = {
        "missing-path": (lambda d: None, bin_name(7)),
        "manifest-missing": (lambda d: (d / manifest_name(2)).unlink(), bin_name(2)),
        "manifest-garbage": (garbage, bin_name(2)),
        # The same size, one byte of the weights changed: only the sha256, as it is read, says so.
        "payload-damaged": (middle, bin_name(2)),
    }
    for name, (damage, payload) in cases.items():
        source_dir = tmp_path / f"src-{name}"
        source_dir.mkdir()
        for f in (bin_name(2), manifest_name(2)):
            (source_dir / f).write_bytes((base / f).read_bytes())
        damage(source_dir)
        source = source_dir / payload
        res = _run(tmp_path / f"new-{name}", cache_dir, "--init-from", str(source))
        assert res.returncode == ExitCode.CONFIG_ERROR, (name, res.stderr)
        assert f"--init-from {source}" in res.stderr and "Traceback" not in res.stderr, res.stderr
    # Into a directory that holds another run's checkpoints: the run directory's refusal, 4.
    intact = tmp_path / "src-intact"
    intact.mkdir()
    for f in (bin_name(2), manifest_name(2)):
        (intact / f).write_bytes((base / f).read_bytes())
    res = _run(base, cache_dir, "--init-from", str(intact / bin_name(2)))
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert f"{base} holds checkpoints" in res.stderr, res.stderr
