"""The resume proof with andrea-proxy in the loop (`verify-resume --mixing proxy`), on a run that
brings its own tokenizer and a JSON Lines arm (`--run-dir`): five fresh `andrea-trainer
--with-proxy` processes, each stopping and restarting its proxy, compared bit for bit, with both
negative controls caught (exit 0)."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from andrea.control import andreactl
from andrea.control.verify_resume.engine import EXIT_INCOMPLETE, EXIT_OK, REPORT_NAME
from andrea.daemon.data.corpus import stdlib_root
from andrea.daemon.rundir.losslog import read_entries
from tests.support.owndata import bpe_file, write_jsonl

RUN_TOML = """\
preset = "andrea-tiny"
device = "cpu"
threads = 1

[data]
tokenizer = "tokenizer.json"

[[data.arms]]
name = "pages"
kind = "jsonl"
paths = ["pages/*.jsonl"]
field = "page"

[[data.arms]]
name = "notes"
kind = "text"
paths = ["notes/*.txt"]
"""


@pytest.fixture(scope="module")
def own_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory as a user prepares it: run.toml naming its own tokenizer.json (relative),
    a JSON Lines arm whose text is at `page`, and a text arm."""
    run = tmp_path_factory.mktemp("own") / "run"
    lib = stdlib_root()
    pages = [(lib / f"{n}.py").read_text()[:6000] for n in ("csv", "uuid", "pprint", "shlex")]
    write_jsonl(
        run / "pages" / "man.jsonl", [{"page": p, "id": i} for i, p in enumerate(pages * 4)]
    )
    (run / "notes").mkdir()
    for name in ("textwrap", "glob", "fnmatch", "string", "bisect", "heapq"):
        shutil.copy(lib / f"{name}.py", run / "notes" / f"{name}.txt")
    bpe_file(run / "tokenizer.json", pages)
    (run / "run.toml").write_text(RUN_TOML)
    return run


@pytest.fixture(scope="module")
def proxy_proof(
    own_run: Path, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[int, dict[str, Any], Path]:
    output = tmp_path_factory.mktemp("proof") / "proxy"
    code = andreactl.main(
        ["--run-dir", str(own_run), "verify-resume", "--problem", "trainer", "--mixing", "proxy",
         "--output", str(output), "--cache-dir", str(cache_dir)]
    )  # fmt: skip
    return code, json.loads((output / REPORT_NAME).read_text()), output


def test_the_proxy_mode_proof_passes_on_a_run_with_its_own_tokenizer(
    proxy_proof: tuple[int, dict[str, Any], Path], own_run: Path
) -> None:
    code, report, output = proxy_proof
    failed = [c["name"] for c in report["full_resume"] + report["checks"] if not c["passed"]]
    assert code == EXIT_OK, (report["error"], failed)
    assert report["mixing"] == "proxy" and report["all_checks_passed"]
    assert report["positive"] and report["negative_divergence_detected"]
    # The proof's config reads the run's own tokenizer where the run keeps it.
    prepared = tomllib.loads((output / "user-config.toml").read_text())
    assert prepared["data"]["tokenizer"] == str(own_run.resolve() / "tokenizer.json")
    full = report["figures"]["full_resume"]
    assert full["bin_identical_to_continuous"] and full["max_weight_diff_vs_continuous"] == 0.0
    for negative in ("no_rng_resume", "no_cursor_resume"):  # each caught on its own
        assert not report["figures"][negative]["bin_identical_to_continuous"]
    # The proxy was in the loop: it assigned both arms, and stopped and restarted with the trainer.
    entries = read_entries(output / "full_resume" / ".loss.json")
    assert {e.arm for e in entries} == {"pages", "notes"}
    stop_log = (output / "logs" / "stop.log").read_text()
    resume_log = (output / "logs" / "full_resume.log").read_text()
    assert "proxy stopped; state written" in stop_log
    assert (
        "starting andrea-proxy" in resume_log
        and "trainer segment 2 connected, resuming after step" in resume_log
    )


def test_a_proof_of_the_other_mixing_is_not_reused(
    proxy_proof: tuple[int, dict[str, Any], Path], tmp_path: Path, cache_dir: Path
) -> None:
    code = andreactl.main(
        ["verify-resume", "--problem", "trainer", "--sabotage", "skip-cursor", "--output",
         str(tmp_path / "s"), "--reuse", str(proxy_proof[2]), "--cache-dir", str(cache_dir)]
    )  # fmt: skip
    assert code == EXIT_INCOMPLETE
    report = json.loads((tmp_path / "s" / REPORT_NAME).read_text())
    assert "only a proof of the same mixing is reused" in report["error"]
