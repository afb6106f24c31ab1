"""Which checkpoint is trusted on start: damaged ones are reported and skipped, ones this run
cannot resume exactly are refused with the reason named, and nothing is half-loaded."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import run_trainer

#: The base run's checkpoints: enough for every damage case of the merged test below to spoil one
#: of its own, newest first, above step 15 (which the resume then starts from).
STEPS = tuple(range(5, 60, 5))


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("base")
    (run_dir / "run.toml").write_text(
        'preset = "andrea-tiny"\n[checkpoint]\nevery = 5\nkeep_latest = 20\n'
    )
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS[-1]))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in run_dir.glob("step_*.bin")) == [bin_name(s) for s in STEPS]
    return run_dir


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _extend(p: Path) -> None:
    p.write_bytes(p.read_bytes() + b"\0\0\0\0")


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def _tear_manifest(p: Path) -> None:
    p.write_text(p.read_text()[:200])


def resign(man: dict) -> dict:
    """Recompute a manifest's content hash as docs/checkpoint-format.md defines it, so that a test
    can reach the checks behind the hash (what a hand-made manifest of a third party would be)."""
    body = {k: v for k, v in man.items() if k != "content_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {**body, "content_sha256": hashlib.sha256(canonical.encode()).hexdigest()}


def _damage_rng(p: Path) -> None:
    # A manifest whose bytes parse but whose RNG state cannot be restored: found when the
    # checkpoint is checked, not after the resume has begun (Accelerate #3960 swallowed this).
    man = json.loads(p.read_text())
    man["rng"]["torch_cpu"] = man["rng"]["torch_cpu"][:400]
    p.write_text(json.dumps(resign(man)))


def _edit_adam_step(p: Path) -> None:
    # Valid JSON, every field in range: only the content hash can tell (the resume would diverge).
    man = json.loads(p.read_text())
    man["optimizer"]["adam_step"] += 1
    p.write_text(json.dumps(man, indent=1))


DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "rng-state": ("json", _damage_rng, r"manifest unreadable: .*rng\.torch_cpu.*RNG state"),
    "edited": ("json", _edit_adam_step, r"content_sha256 .* does not match the content"),
    "truncated": ("bin", _truncate, r"payload is \d+ bytes, manifest says"),
    "wrong-size": ("bin", _extend, r"payload is \d+ bytes, manifest says"),
    "hash-mismatch": ("bin", _flip, r"sha256 .* does not match manifest"),
    "missing-payload": ("bin", Path.unlink, r"payload missing"),
    "torn-manifest": ("json", _tear_manifest, r"manifest unreadable"),
}


def _skip_reasons(stderr: str) -> dict[int, str]:
    """Each "skipping checkpoint N: reason" of a start's log, up to the next skip or log record."""
    chunks = re.split(r"skipping checkpoint (\d+): ", stderr)
    return {
        int(step): re.split(r"\n\d\d:\d\d:\d\d ", text)[0]
        for step, text in zip(chunks[1::2], chunks[2::2], strict=True)
    }


def test_damaged_newest_is_skipped_with_its_reason(
    tmp_path: Path, base_run: Path, cache_dir: Path
) -> None:
    """Every kind of damage (DAMAGE), each done to its own checkpoint, and above them a payload
    without a manifest (an interrupted write) and a writer's temporary: one start skips each
    damaged one as the newest left, naming it and its reason, ignores the interrupted write,
    removes the temporary, and resumes from the newest intact checkpoint (one start checks every
    case: a start is most of the cost)."""
    run_dir = tmp_path / "run"
    shutil.copytree(base_run, run_dir)
    newest, *damaged = STEPS[::-1]
    # The interrupted write: the newest payload has no manifest, and a temporary lies beside it.
    (run_dir / manifest_name(newest)).unlink()
    temporary = run_dir / f"{bin_name(newest + 5)}.4242.tmp"
    temporary.write_bytes(b"partial")
    cases = dict(zip(sorted(DAMAGE), damaged, strict=False))
    for case, step in cases.items():
        kind, damage, _ = DAMAGE[case]
        damage(run_dir / (bin_name(step) if kind == "bin" else manifest_name(step)))
    resumed = min(cases.values()) - 5
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(newest))
    assert res.returncode == ExitCode.OK, res.stderr
    assert f"ignoring {bin_name(newest)}: it has no manifest" in res.stderr, res.stderr
    assert f"removing {temporary.name}" in res.stderr and not temporary.exists(), res.stderr
    skipped = _skip_reasons(res.stderr)
    assert sorted(skipped) == sorted(cases.values()), res.stderr
    for case, step in cases.items():
        assert re.search(DAMAGE[case][2], skipped[step]), (case, step, skipped[step])
    assert f"resumed from {bin_name(resumed)}" in res.stderr, res.stderr
    # Training re-reached the newest step and wrote a good checkpoint over each damaged one.
    for case, step in cases.items():
        man = json.loads((run_dir / manifest_name(step)).read_text())
        assert (run_dir / bin_name(step)).stat().st_size == man["bin_size"], case
    assert (run_dir / manifest_name(newest)).exists()


def test_all_damaged_is_refused_not_reset(tmp_path: Path, base_run: Path, cache_dir: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(base_run, run_dir)
    for p in run_dir.glob("step_*.bin"):
        _flip(p)
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS[-1] + 5))
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert f"none of the {len(STEPS)} checkpoints" in res.stderr
    assert not (run_dir / bin_name(STEPS[-1] + 5)).exists()


def test_different_preset_is_refused_with_the_difference_named(
    tmp_path: Path, base_run: Path, cache_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(base_run, run_dir)
    (run_dir / "run.toml").write_text('preset = "andrea-tiny"\n[model]\nn_layer = 3\n')
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS[-1] + 5))
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "model config differs" in res.stderr and "n_layer: 2 → 3" in res.stderr
    # No flag resumes another model: the refusal does not suggest one.
    assert "--allow-config-change" not in res.stderr, res.stderr


def test_changed_data_is_refused_with_the_arm_named(
    tmp_path: Path, base_run: Path, cache_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(base_run, run_dir)
    (run_dir / "notes").mkdir()
    (run_dir / "notes" / "a.txt").write_text("hello world, " * 500)
    (run_dir / "run.toml").write_text(
        'preset = "andrea-tiny"\n'
        '[[data.arms]]\nname = "code"\nkind = "stdlib"\npart = "code"\n'
        '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.txt"]\n'
    )
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS[-1] + 5))
    assert res.returncode == ExitCode.RESUME_REFUSED, res.stderr
    assert "data arm 'notes'" in res.stderr and "data arm 'docstrings'" in res.stderr


def test_changed_hyperparameters_need_explicit_consent(
    tmp_path: Path, base_run: Path, cache_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(base_run, run_dir)
    (run_dir / "run.toml").write_text(
        'preset = "andrea-tiny"\n[optim]\nlr = 0.002\n[checkpoint]\nevery = 5\nkeep_latest = 20\n'
    )
    res = run_trainer(run_dir, cache_dir, "--max-steps", str(STEPS[-1] + 2))
    assert res.returncode == ExitCode.RESUME_REFUSED and "--allow-config-change" in res.stderr, (
        res.stderr
    )
    res = run_trainer(
        run_dir, cache_dir, "--max-steps", str(STEPS[-1] + 2), "--allow-config-change"
    )
    assert res.returncode == ExitCode.OK and f"resumed from {bin_name(STEPS[-1])}" in res.stderr, (
        res.stderr
    )


def test_bad_config_is_a_config_error(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "run.toml").write_text('preset = "andrea-tiny"\nbatch_sise = 4\n')
    res = run_trainer(tmp_path, cache_dir, "--max-steps", "1")
    assert res.returncode == ExitCode.CONFIG_ERROR
    assert "batch_sise: unknown key" in res.stderr
