"""verify-resume on the user's own configuration: the config the five trainer processes get, and the
refusals, without running them (tests/process/test_verify_resume_trainer.py runs the protocol itself)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from andrea.control import andreactl
from andrea.control.verify_resume import trainer as vr
from andrea.daemon.config import build_config, for_new_run
from andrea.daemon.data.corpus import stdlib_root
from andrea.daemon.data.open_settings import resolve_open_settings
from andrea.daemon.data.tokenizer import load_tokenizer, padded_vocab
from tests.support.owndata import bpe_file

CONFIG = """preset = "andrea-tiny"
batch_size = 4
[data]
tokenizer = "tok/tokenizer.json"
[[data.arms]]
name = "notes"
kind = "text"
paths = ["notes/*.txt", "/abs/*.md"]
[[data.arms]]
name = "tok"
kind = "tokens"
path = "data/tok.bin"
[metrics]
tensorboard = true
"""


def test_the_user_config_as_the_proof_runs_it(tmp_path: Path) -> None:
    source = tmp_path / "run.toml"
    source.write_text(CONFIG)
    prepared = vr.user_config(tmp_path / "out", source, tmp_path / "base")
    values = tomllib.loads(prepared.read_text())
    notes, tok = values["data"]["arms"]
    assert notes["paths"] == [str(tmp_path / "base" / "notes/*.txt"), "/abs/*.md"]
    assert tok["path"] == str(tmp_path / "base" / "data/tok.bin")
    # The run's own tokenizer lies in the run directory too, not in the proof's path directories.
    assert values["data"]["tokenizer"] == str(tmp_path / "base" / "tok/tokenizer.json")
    assert "metrics" not in values and values["batch_size"] == 4
    cmd = vr._trainer_command(tmp_path / "p", None, config=prepared)
    assert cmd[cmd.index("--config") + 1] == str(prepared)
    assert "--preset" not in cmd and "--threads" not in cmd
    assert cmd[cmd.index("--mixing") + 1] == "fixed"
    default = vr._trainer_command(tmp_path / "p", None)
    assert "--config" not in default and default[default.index("--preset") + 1] == "andrea-tiny"


def ctl(capsys, *args: str) -> tuple[int, str]:
    """andreactl verify-resume in this process: (exit code, stderr)."""
    try:
        code = andreactl.main(["verify-resume", *args])
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code)
    return code, capsys.readouterr().err


def test_refusals_change_nothing(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('preset = "andrea-tiny"\nbatch_sise = 4\n')
    out = tmp_path / "proof"
    for args, message in (
        (("--problem", "mini", "--config", str(bad)), "trainer problem only"),
        (("--problem", "trainer", "--config", str(bad)), "batch_sise: unknown key"),
        (("--problem", "trainer", "--config", str(tmp_path / "none.toml")), "not found"),
        (("--problem", "trainer", "--run-dir", str(tmp_path / "norun")), "not found"),
    ):
        code, err = ctl(capsys, "--output", str(out), *args)
        assert code == 2, (args, err)
        assert message in err and "Traceback" not in err, (args, err)
    assert not out.exists()


def test_an_absolute_or_byte_tokenizer_is_kept(tmp_path: Path) -> None:
    for spec in ("bytes", "/models/tokenizer.json"):
        source = tmp_path / "run.toml"
        source.write_text(f'preset = "andrea-tiny"\n[data]\ntokenizer = "{spec}"\n')
        prepared = vr.user_config(tmp_path / spec.replace("/", "_"), source, tmp_path / "base")
        assert tomllib.loads(prepared.read_text())["data"]["tokenizer"] == spec


def test_a_new_run_without_run_toml_leaves_the_vocabulary_to_its_tokenizer(tmp_path: Path) -> None:
    """`--config FILE` (the proof's user-config.toml) or `--tokenizer` on a new run: the vocabulary
    the file leaves open is the tokenizer's, not the preset's 256 bytes."""
    texts = [(stdlib_root() / f"{n}.py").read_text() for n in ("csv", "shlex")]
    bpe_file(tmp_path / "tokenizer.json", texts)
    n_vocab = load_tokenizer("tokenizer.json", tmp_path).n_vocab
    assert n_vocab > 256
    new = for_new_run(
        build_config({"preset": "andrea-tiny", "data": {"tokenizer": "tokenizer.json"}})
    )
    assert resolve_open_settings(new, tmp_path, False).cfg.model.vocab_size == padded_vocab(n_vocab)
