"""A user's mistake is a clear exit 2 or 5 naming the problem, never a traceback (issue 12, item 14),
and nothing is recorded that would make the next start repeat it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import trainer_cmd


def _trainer(run_dir: Path, cache: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = trainer_cmd(run_dir, cache, "--max-steps", "2", *extra)
    return forkserver.run(cmd, capture_output=True, text=True, timeout=180)


def _toml(text: bytes) -> Callable[[Path], list[str]]:
    def setup(run_dir: Path) -> list[str]:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.toml").write_bytes(text)
        return []

    return setup


def _flags(*flags: str) -> Callable[[Path], list[str]]:
    return lambda run_dir: list(flags)


def _empty_tokens(run_dir: Path) -> list[str]:
    run_dir.mkdir(parents=True)
    (run_dir / "t.bin").write_bytes(b"")
    (run_dir / "run.toml").write_text(
        '[[data.arms]]\nname = "t"\nkind = "tokens"\npath = "t.bin"\n'
    )
    return []


def _cache_is_a_file(run_dir: Path) -> list[str]:
    run_dir.mkdir(parents=True)
    (run_dir / "not-a-dir").write_text("x")
    return ["--cache-dir", str(run_dir / "not-a-dir" / "cache")]


def _fifo_toml(run_dir: Path) -> list[str]:
    # Issue 24, item 4: open() of a FIFO waited for a writer forever, deaf to SIGTERM.
    run_dir.mkdir(parents=True)
    os.mkfifo(run_dir / "run.toml")
    return []


CASES: dict[str, tuple[Callable[[Path], list[str]], int, str]] = {
    "run-toml-fifo": (_fifo_toml, ExitCode.CONFIG_ERROR, "run.toml: not a regular file (a FIFO)"),
    "non-utf8-toml": (_toml(b'preset = "\xff\xfe"\n'), ExitCode.CONFIG_ERROR, "not UTF-8"),
    "deep-toml": (
        _toml(b"x = " + b"[" * 50000 + b"]" * 50000 + b"\n"),
        ExitCode.CONFIG_ERROR,
        "run.toml",
    ),
    "beta1-5": (_toml(b"[optim]\nbeta1 = 5.0\n"), ExitCode.CONFIG_ERROR, "optim.beta1"),
    "eps-negative": (_toml(b"[optim]\neps = -1.0\n"), ExitCode.CONFIG_ERROR, "optim.eps"),
    "lr-inf": (_toml(b"[optim]\nlr = inf\n"), ExitCode.CONFIG_ERROR, "optim.lr"),
    "batch-string": (_toml(b'batch_size = "8"\n'), ExitCode.CONFIG_ERROR, "batch_size"),
    "seed-float": (_toml(b"seed = 1e3\n"), ExitCode.CONFIG_ERROR, "seed"),
    "huge-batch-flag": (
        _flags("--batch-size", "100000000"),
        ExitCode.CONFIG_ERROR,
        "batch_size (from the command line)",
    ),
    "empty-tokens-file": (_empty_tokens, ExitCode.DATA_ERROR, "is empty"),
    "cache-dir-unusable": (_cache_is_a_file, ExitCode.CONFIG_ERROR, "not-a-dir"),
}


@pytest.mark.parametrize("case", CASES)
def test_user_mistake_is_a_clear_exit(case: str, tmp_path: Path, cache_dir: Path) -> None:
    setup, code, needle = CASES[case]
    run_dir = tmp_path / "run"
    extra = setup(run_dir)
    res = _trainer(run_dir, cache_dir, *extra)
    assert res.returncode == code, res.stderr
    assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    if case == "huge-batch-flag":  # nothing recorded that a restart would repeat
        assert (
            not (run_dir / "run.toml").exists()
            or "100000000" not in (run_dir / "run.toml").read_text()
        )


@pytest.fixture(scope="module")
def non_ascii_run(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[Path, subprocess.CompletedProcess]:
    """A 2-step run (seed 7) in a directory under 100 characters but over 107 bytes: its start,
    read by one test, and the run, which test_deleted_run_toml_is_not_rewritten_before_a_refusal
    goes on with (one start for both)."""
    root = tmp_path_factory.mktemp("u")
    run_dir = root / ("é" * max(1, 99 - len(str(root)) - 1))
    return run_dir, _trainer(run_dir, cache_dir, "--seed", "7")


def test_non_ascii_run_dir_longer_in_bytes_than_in_characters(
    non_ascii_run: tuple[Path, subprocess.CompletedProcess],
) -> None:
    # Under 100 characters, over 107 bytes: the socket must move to the short per-run directory.
    run_dir, res = non_ascii_run
    assert len(str(run_dir)) < 100 and len(os.fsencode(run_dir)) > 107
    assert res.returncode == ExitCode.OK, res.stderr


def test_proxy_run_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    cmd = [sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(tmp_path / "f")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == ExitCode.CONFIG_ERROR and "not a usable directory" in res.stderr
    assert "Traceback" not in res.stderr


def test_deleted_run_toml_is_not_rewritten_before_a_refusal(
    non_ascii_run: tuple[Path, subprocess.CompletedProcess], cache_dir: Path
) -> None:
    run_dir, res = non_ascii_run  # a 2-step run of seed 7
    assert res.returncode == ExitCode.OK, res.stderr
    # run.toml alone deleted: the run's resolved config still says seed 7, and it resumes.
    (run_dir / "run.toml").unlink()
    res = _trainer(run_dir, cache_dir, "--max-steps", "6")
    assert res.returncode == ExitCode.OK, res.stderr
    # Both deleted: rebuilt from defaults and flags, and recorded only once the resume is accepted.
    (run_dir / ".run.resolved.toml").unlink()
    res = _trainer(run_dir, cache_dir, "--max-steps", "6")  # the default seed: refused
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert not (run_dir / "run.toml").exists() and not (run_dir / ".run.resolved.toml").exists()
    res = _trainer(run_dir, cache_dir, "--seed", "7", "--max-steps", "6")
    assert res.returncode == ExitCode.OK, res.stderr
    assert "seed = 7" in (run_dir / "run.toml").read_text()
    assert "seed = 7" in (run_dir / ".run.resolved.toml").read_text()


def test_proxy_policy_linked_to_dev_zero(tmp_path: Path) -> None:
    """Issue 24, item 4: the proxy read /dev/zero to 3.1 GB; now exit 2 naming the file, at once,
    under a 4 GiB address-space limit that an unbounded read would exhaust."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    (tmp_path / "run.toml").write_text('preset = "andrea-tiny"\nmixing = "proxy"\n')
    (tmp_path / "policy.toml").symlink_to("/dev/zero")
    cmd = [sys.executable, "-m", "andrea.daemon.mixing.cli", "--run-dir", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=limited)
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "policy.toml: not a regular file (a character device)" in res.stderr
    assert "Traceback" not in res.stderr and "out of memory" not in res.stderr


def test_trainer_takes_the_run_dir_from_the_environment_and_leaves_nothing_on_a_bad_preset(
    tmp_path: Path,
) -> None:
    """Issue 24, item 21: andrea-trainer ignored ANDREA_RUN_DIR (which andreactl honours), and a
    misspelled preset left an empty run directory behind."""
    run_dir = tmp_path / "runs" / "demo"
    cmd = [sys.executable, "-m", "andrea.daemon.trainer.service.cli", "--preset", "andrea-12n"]
    env = {**os.environ, "ANDREA_RUN_DIR": str(run_dir)}
    res = forkserver.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "unknown preset 'andrea-12n'" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists(), "a refused start creates no run directory"
