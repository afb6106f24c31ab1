"""Export: a verified copy of a checkpoint, reloaded in a fresh process, and what is refused."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from andrea.control import andreactl
from andrea.control.export import bundle as ex
from andrea.daemon.rundir.layout import bin_name
from tests.support.daemons import run_trainer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A 12-step run with checkpoints at 5, 10 and 12."""
    run = tmp_path_factory.mktemp("run")
    res = run_trainer(run, cache_dir, "--max-steps", "12", "--checkpoint-every", "5")
    assert res.returncode == 0, res.stderr
    return run


def _quiet(_: str) -> None:
    pass


def test_export_round_trip(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "export"
    assert (
        andreactl.main(["--run-dir", str(run_dir), "--json", "export", "--to", str(dest)])
        == ex.EXIT_OK
    )
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((dest / ex.REPORT_NAME).read_text())

    assert report["step"] == 12 and report["skipped"] == []
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [
            bin_name(12),
            "step_000012.json",
            "run.toml",
            "metrics.json",
            "README.md",
            "export.json",
            "audit",
        ]
    )
    assert sorted(p.name for p in (dest / "audit").iterdir()) == [".loss.json", "plot.png"]
    for name in (bin_name(12), "step_000012.json", "run.toml"):
        assert (dest / name).read_bytes() == (run_dir / name).read_bytes()
    for f in report["files"]:
        assert (dest / f["name"]).stat().st_size == f["size"]

    evaluation = report["evaluation"]
    assert evaluation["bitwise_equal"] and evaluation["reload"]["pid"] != os.getpid()
    assert evaluation["reload"]["eval_loss_hex"] == evaluation["loss_at_export_hex"]
    # The documented loader gives the same bits here too.
    model, manifest = ex.load_model(dest)
    assert ex.eval_loss(model).hex() == evaluation["loss_at_export_hex"]
    assert manifest.step == 12 and model.n_params() == manifest.n_params

    # The payload reads with numpy alone, as the README says.
    flat = np.fromfile(dest / bin_name(12), dtype="<f4", offset=8)
    assert flat.size == 3 * manifest.n_params
    first = manifest.layout[0]
    wte = flat[first.offset : first.offset + int(np.prod(first.shape))].reshape(first.shape)
    assert np.array_equal(wte, model.wte.weight.detach().numpy())

    metrics = json.loads((dest / "metrics.json").read_text())
    losses = {e["step"]: e["loss"] for e in json.loads((run_dir / ".loss.json").read_text())}
    assert metrics["loss"] == losses[12]
    ema = losses[1]
    for step in range(2, 13):
        ema = 0.9 * ema + 0.1 * losses[step]
    assert metrics["loss_ema"] == pytest.approx(ema, rel=1e-12)
    assert [a["name"] for a in metrics["data"]] == ["docstrings", "code", "comments"]
    assert all(len(a["identity"]) == 64 for a in metrics["data"])


def test_a_damaged_checkpoint_is_refused(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = tmp_path / "run"
    shutil.copytree(
        run_dir, damaged, ignore=shutil.ignore_patterns(".sock")
    )  # the trainer's stale socket
    payload = damaged / bin_name(12)
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0x01
    payload.write_bytes(bytes(data))

    dest = tmp_path / "refused"
    assert (
        ex.main(["--run-dir", str(damaged), "--to", str(dest), "--step", "12"]) == ex.EXIT_REFUSED
    )
    err = capsys.readouterr().err
    assert "step_000012.bin is not intact" in err and "sha256" in err
    assert not dest.exists()

    # Without --step, the newest intact checkpoint is exported and the damaged one named.
    report = ex.export_checkpoint(damaged, tmp_path / "fallback", progress=_quiet)
    assert report.step == 10 and report.evaluation.bitwise_equal
    assert len(report.skipped) == 1 and report.skipped[0].startswith("step_000012.json")


def test_an_existing_destination_is_refused(run_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "keep.txt").write_text("earlier export")
    assert ex.main(["--run-dir", str(run_dir), "--to", str(dest)]) == ex.EXIT_REFUSED
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert (dest / "keep.txt").read_text() == "earlier export"

    (tmp_path / "file").write_text("x")
    with pytest.raises(ex.ExportRefused, match="not a directory"):
        ex.export_checkpoint(run_dir, tmp_path / "file", progress=_quiet)


def test_export_is_an_audit_bundle(audited_run: Path, tmp_path: Path, capsys) -> None:
    """The loss log, the policy and every pivot archive, the plot, and safetensors weights that equal
    the payload's; the export still reloads and verifies."""
    dest = tmp_path / "bundle"
    argv = ["export", "--run-dir", str(audited_run), "--to", str(dest), "--safetensors", "--json"]
    assert andreactl.main(argv) == ex.EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["evaluation"]["bitwise_equal"]
    audit = dest / "audit"
    sources = [".loss.json", "policy.toml", ".state.json"] + [
        str(p.relative_to(audited_run)) for p in (audited_run / "archive").rglob("*") if p.is_file()
    ]
    assert any(name.endswith("/pivot.json") for name in sources)
    listed = {f["name"]: f for f in report["files"]}
    for name in sources:
        assert (audit / name).read_bytes() == (audited_run / name).read_bytes(), name
        assert listed[f"audit/{name}"]["size"] == (audited_run / name).stat().st_size
    assert (audit / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "audit/plot.png" in listed

    from safetensors.numpy import load_file

    step = report["step"]
    manifest = json.loads((dest / f"step_{step:06d}.json").read_text())
    flat = np.fromfile(dest / bin_name(step), dtype="<f4", offset=8)[: manifest["n_params"]]
    tensors = load_file(str(dest / "model.safetensors"))
    assert set(tensors) == {e["name"] for e in manifest["layout"]}
    for e in manifest["layout"]:
        n = int(np.prod(e["shape"]))
        expected = flat[e["offset"] : e["offset"] + n].reshape(e["shape"])
        assert tensors[e["name"]].tobytes() == expected.tobytes(), e["name"]
    assert any(c["name"] == "safetensors weights" for c in report["checks"])


def _planted(run_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the run with links planted by whoever can write it: policy.toml to a 0600 file
    outside, .samples.json to another, an archive's pivot.json to the first and a whole archive
    directory to a folder outside; .state.json is a FIFO. (The copy and its secrets.)"""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns(".sock"))
    secret, other = tmp_path / "shadow", tmp_path / "notes.json"
    secret.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    other.write_text('{"format": "andrea-samples/1", "kept": 1, "records": []}')
    for f in (secret, other):
        f.chmod(0o600)
    (run / "policy.toml").symlink_to(secret)
    (run / ".samples.json").symlink_to(other)
    os.mkfifo(run / ".state.json")
    archive = run / "archive" / "pivot-000005-20250101T000000Z"
    archive.mkdir(parents=True)
    (archive / "pivot.json").symlink_to(secret)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "pivot.json").write_text('{"boundary_step": 10}')
    (run / "archive" / "pivot-000010-20250101T000100Z").symlink_to(outside)
    return run, secret


def test_links_in_the_run_directory_are_refused_and_named(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24, item 1: an export never copies what a link points at; it refuses, naming each
    offender, and writes nothing. (`andreactl export` as its command line calls it, in this
    process: the refusal comes before the reload that needs a process of its own.)"""
    run, secret = _planted(run_dir, tmp_path)
    dest = tmp_path / "export"
    code = andreactl.main(["--run-dir", str(run), "export", "--to", str(dest)])
    out, err = capsys.readouterr()
    assert code == ex.EXIT_REFUSED, out + err
    assert "Traceback" not in err
    for offender, kind in (
        ("policy.toml", "a symbolic link"),
        (".samples.json", "a symbolic link"),
        (".state.json", "a FIFO"),
        ("archive/pivot-000005-20250101T000000Z/pivot.json", "a symbolic link"),
        ("archive/pivot-000010-20250101T000100Z", "a symbolic link"),
    ):
        assert f"{offender}: {kind}" in err, (offender, err)
    assert not dest.exists(), "a refused export writes nothing"
    assert "secret-hash" not in out + err


def test_a_destination_that_cannot_be_created_is_a_refusal(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24, item 11: nothing was written, so exit 2 and no advice to remove anything."""
    assert ex.main(["--run-dir", str(run_dir), "--to", "/proc/andrea-export"]) == ex.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "cannot create /proc/andrea-export" in err and "NOT VERIFIED" not in err


def test_what_an_export_cannot_record_is_refused_before_anything_is_written(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """M8: a destination whose name is not UTF-8 failed after the whole copy (export.json records
    it as text); a run.toml whose [export] table the model card cannot use is refused too."""
    dest = tmp_path / os.fsdecode(b"exp\xe9")
    argv = ["--json", "export", "--run-dir", str(run_dir), "--to", str(dest)]
    assert andreactl.main(argv) == ex.EXIT_REFUSED
    out, err = capsys.readouterr()
    assert "--to " + str(tmp_path) + "/exp\\xe9: the name is not UTF-8" in err, err
    assert json.loads(out)["exit_code"] == ex.EXIT_REFUSED
    assert not os.path.lexists(dest), "a refused export writes nothing"

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns(".sock*", "*.lock"))
    with (run / "run.toml").open("a") as f:
        f.write('\n[export]\nlicense = "mit"\nlanguage = "en"\n')
    hf = tmp_path / "hf"
    argv = ["export", "--run-dir", str(run), "--to", str(hf), "--format", "hf"]
    assert andreactl.main(argv) == ex.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"{run / 'run.toml'}: [export]:\n  language: Input should be a valid list" in err
    assert not hf.exists(), "a refused export writes nothing"


def test_the_model_card_describes_the_mixture_and_the_pivots(audited_run: Path) -> None:
    """Each phase's arms, steps and share of the tokens, counted on the run's loss log, and the
    pivot between the phases (tests/support/audited_run.py: a pivot, a zombie arm after it)."""
    from andrea.control.export import card
    from andrea.daemon.config import ExportConfig
    from andrea.daemon.data.tokenizer import ByteTokenizer
    from andrea.daemon.rundir.losslog import read_curve

    manifest = ex.select_checkpoint(audited_run, None).manifest
    mix = card.mixture(audited_run, manifest.step)
    curve = read_curve(audited_run / ".loss.json")
    assert [p.phase for p in mix.phases] == [0, 1] and len(mix.pivots) == 1
    boundary = mix.pivots[0][0]
    assert mix.phases[0].last == boundary and mix.phases[1].first == boundary + 1
    for ph in mix.phases:
        mine = (curve.phase == ph.phase) & (curve.step <= manifest.step)
        assert sum(s for s, _ in ph.arms.values()) == int(mine.sum())
        assert sum(t for _, t in ph.arms.values()) == int(curve.tokens[mine].sum())
    assert "comments" in mix.phases[0].arms and "comments" not in mix.phases[1].arms
    text = card.model_card(manifest, [], "andreactl export", ByteTokenizer(), ExportConfig(), mix)
    assert "Mixing: `proxy`: andrea-proxy's bandit chose each step's arm." in text
    assert f"- after step {boundary:,}: phase 1, policy `{mix.pivots[0][2][:16]}`" in text
    assert f'andrea_pivots: [{{"after_step": {boundary}, "phase": 1}}]' in text
    assert "license:" not in text  # no [export] table: no Hub metadata invented
