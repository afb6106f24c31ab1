"""--init-from across tokenizers: a checkpoint trained under another tokenizer of the same size has
the same shape, but its embedding rows stand for other tokens. A real trainer refuses it (exit 2),
naming both tokenizers, unless --init-from-other-tokenizer says it is meant."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from andrea.daemon.rundir.layout import bin_name
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support import forkserver
from tests.support.daemons import trainer_cmd
from tests.support.owndata import PROSE, bpe_file

OTHER_PROSE = "Zebras quietly juggle seventeen violet umbrellas beside the frozen harbour. " * 5


def _run(run: Path, cache: Path, tokenizer: str, *extra: str) -> subprocess.CompletedProcess:
    """A run of one text arm under `tokenizer` (a file in the run directory, or bytes), its model
    of 320 ids whichever it is: the same shape under every tokenizer of these tests."""
    (run / "notes").mkdir(parents=True, exist_ok=True)
    for i in range(4):
        (run / "notes" / f"n{i}.txt").write_text(PROSE * 20)
    (run / "run.toml").write_text(
        f'[data]\ntokenizer = "{tokenizer}"\n[model]\nvocab_size = 320\n'
        '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.txt"]\n'
    )
    cmd = trainer_cmd(run, cache, "--max-steps", "1", "--checkpoint-every", "1", *extra)
    return forkserver.run(cmd, capture_output=True, text=True, timeout=180)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, str]:
    """One step of a run under a BPE of its own: its checkpoint, and the tokenizer's sha256."""
    run = tmp_path_factory.mktemp("init-tok") / "source"
    bpe_file(run / "tokenizer.json", [PROSE * 10])
    res = _run(run, cache_dir, "tokenizer.json")
    assert res.returncode == 0, res.stderr
    return run / bin_name(1), _sha(run / "tokenizer.json")


def test_another_tokenizer_of_the_same_size_is_refused_naming_both(
    source: tuple[Path, str], tmp_path: Path, cache_dir: Path
) -> None:
    ckpt, source_sha = source
    new = tmp_path / "new"
    bpe_file(new / "tokenizer.json", [OTHER_PROSE * 10])
    new_sha = _sha(new / "tokenizer.json")
    assert new_sha != source_sha
    res = _run(new, cache_dir, "tokenizer.json", "--init-from", str(ckpt))
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert f"trained under the tokenizer of sha256 {source_sha}" in res.stderr, res.stderr
    assert f"[data] tokenizer is tokenizer.json (sha256 {new_sha}" in res.stderr, res.stderr
    assert "--init-from-other-tokenizer" in res.stderr and "Traceback" not in res.stderr
    assert not list(new.glob("step_*")), "a refused start trains nothing"

    # Said on purpose, it starts, and the log says from what.
    res = _run(new, cache_dir, "tokenizer.json", "--init-from", str(ckpt),
               "--init-from-other-tokenizer")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "WARNING" in res.stderr and "starting from it anyway" in res.stderr, res.stderr
    assert (new / bin_name(1)).is_file()


def test_bytes_against_a_subword_checkpoint_is_refused(
    source: tuple[Path, str], tmp_path: Path, cache_dir: Path
) -> None:
    ckpt, source_sha = source
    new = tmp_path / "bytes"
    res = _run(new, cache_dir, "bytes", "--init-from", str(ckpt))
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert f"the tokenizer of sha256 {source_sha}" in res.stderr, res.stderr
    assert "this run's [data] tokenizer is bytes" in res.stderr, res.stderr
    # The same tokenizer (a copy of the file) is this run's: the check passes.
    same = tmp_path / "same"
    same.mkdir()
    shutil.copy(ckpt.parent / "tokenizer.json", same / "tokenizer.json")
    res = _run(same, cache_dir, "tokenizer.json", "--init-from", str(ckpt), "--check")
    assert res.returncode == 0, res.stderr
