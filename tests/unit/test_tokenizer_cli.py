"""`andreactl tokenizer train|encode`: a tokenizer trained on the run's training documents only, never
its held-out ones; token files that record the tokenizer that made them; refusals as exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from andrea.control import andreactl
from andrea.control.reports import TokenizerEncodeReport, TokenizerTrainReport
from andrea.control.tokenizer_tool import _arm_row, _Tally, encode_text, train_text
from andrea.daemon.data.encoding import read_record
from andrea.daemon.data.heldout import is_held_out
from andrea.daemon.data.tokenizer import load_tokenizer
from tests.support.owndata import (
    PROSE,
    bpe_file,
    names,
    sparse_bpe_file,
    two_id_bpe_file,
    word_level_file,
    write_jsonl,
)
from tests.support.reports import check

RUN_TOML = """\
[data]
tokenizer = "tokenizer.json"

[[data.arms]]
name = "notes"
kind = "text"
paths = ["notes/*.txt"]

[[data.arms]]
name = "web"
kind = "jsonl"
paths = ["web/*.jsonl"]

[[data.arms]]
name = "pre"
kind = "tokens"
path = "pre.u16"
dtype = "uint16"
"""


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "notes").mkdir(parents=True)
    (run / "run.toml").write_text(RUN_TOML)
    # Held-out documents (at the default 5%) alone hold "zq"; training documents alone "xj".
    for name in names("{}.txt", 0.05, True, 3):
        (run / "notes" / name).write_text("zqzqzq zqzq zqzqzqzq " * 200)
    for name in names("{}.txt", 0.05, False, 12):
        (run / "notes" / name).write_text(PROSE + "xjxjxj xjxj xjxjxjxj " * 50)
    held = set(names("web.jsonl:{}", 0.05, True, 2))
    rows = [{"text": "zqzqzq " * 300 if f"web.jsonl:{i}" in held else PROSE} for i in range(1, 80)]
    write_jsonl(run / "web" / "web.jsonl", rows)
    return run


def ctl(*argv: str) -> int:
    """andreactl in this process; a usage error's exit code as argparse gives it."""
    try:
        return andreactl.main(list(argv))
    except SystemExit as e:
        return int(e.code or 0)


def _vocab(path: Path) -> set[str]:
    return set(json.loads(path.read_text())["model"]["vocab"])


def test_train_sees_the_training_documents_only(run: Path, capsys) -> None:
    argv = ["--json", "tokenizer", "train", "--run-dir", str(run), "--vocab-size", "400"]
    assert andreactl.main(argv) == 0
    doc = capsys.readouterr().out
    vocab = _vocab(run / "tokenizer.json")
    assert any("xj" in t for t in vocab), "the training documents' pairs are merged"
    assert not any("zq" in t for t in vocab), "a held-out document was trained on"
    # The --json report is the registered schema's; it counts and measures each text arm.
    assert check("tokenizer", doc, capsys) == "TokenizerTrainReport"
    report = TokenizerTrainReport.model_validate_json(doc)
    assert report.n_vocab == len(vocab) and report.model_vocab_size == -(-len(vocab) // 64) * 64
    arms = {a.arm: a for a in report.arms}
    assert set(arms) == {"notes", "web"}
    assert (arms["notes"].held_out, arms["notes"].documents) == (3, 12)
    held = sum(is_held_out(f"web.jsonl:{i}", 0.05) for i in range(1, 80))
    assert held >= 2 and (arms["web"].held_out, arms["web"].documents) == (held, 79 - held)
    assert arms["web"].bytes_per_token is not None and arms["web"].bytes_per_token > 1.5
    text = train_text(report, run, "bytes")
    assert f"byte-level BPE of {report.n_vocab} ids" in text
    assert 'to train with it: [data] tokenizer = "tokenizer.json"' in text
    # The hint is a run.toml path, relative to the run directory whatever --out was relative to.
    nested = report.model_copy(update={"out": str(run / "tok" / "t.json")})
    assert '[data] tokenizer = "tok/t.json"' in train_text(nested, run, "bytes")
    outside = report.model_copy(update={"out": "elsewhere.json"})
    assert f'[data] tokenizer = "{Path("elsewhere.json").absolute()}"' in train_text(
        outside, run, "bytes"
    )


def test_encode_writes_the_tokens_file_and_its_record(run: Path, capsys) -> None:
    assert andreactl.main(["tokenizer", "train", "--run-dir", str(run), "--vocab-size", "300"]) == 0
    capsys.readouterr()
    (run / "books").mkdir()
    (run / "books" / "a.txt").write_text(PROSE * 30)
    argv = ["tokenizer", "encode", "--run-dir", str(run), "--out", str(run / "pre.u16")]
    argv += ["--input", str(run / "books" / "*.txt"), str(run / "web" / "web.jsonl")]
    assert andreactl.main(["--json", *argv]) == 0
    assert check("tokenizer", capsys.readouterr().out, capsys) == "TokenizerEncodeReport"
    tok = load_tokenizer("tokenizer.json", run)
    record = read_record(run / "pre.u16")
    assert record is not None and record.tokenizer == tok.identity
    assert record.documents == 1 + 79 and record.sources[0].endswith("books/a.txt")
    ids = np.fromfile(run / "pre.u16", dtype="<u2")
    assert len(ids) == record.tokens and tok.decode(ids[:50].tolist()).startswith(PROSE[:40])
    # Written over: never. The text report shows the arm to paste, relative to the run.
    assert andreactl.main(argv) == 2
    assert "pre.u16 exists" in capsys.readouterr().err
    (run / "pre.u16").unlink()
    (run / "pre.u16.json").unlink()
    assert andreactl.main(argv) == 0
    assert 'path = "pre.u16"' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--vocab-size", "100"], "--vocab-size 100: a byte-level BPE needs 257"),
        (["train", "--vocab-size", "300", "--arm", "nope"], "--arm nope: the run has no such arm"),
        (["train", "--vocab-size", "300", "--arm", "pre"], "a tokens arm holds ids"),
        (["encode", "--out", "x.u16", "--input", "missing/*.txt"], "missing/*.txt: no such file"),
        (["encode", "--out", "x.u16"], "encode needs --input"),
    ],
)
def test_mistakes_are_exit_2(run: Path, argv: list[str], message: str, capsys) -> None:
    assert ctl("tokenizer", argv[0], "--run-dir", str(run), *argv[1:]) == 2
    assert message in capsys.readouterr().err


def test_train_needs_a_run_toml_and_never_writes_over_a_tokenizer(run: Path, capsys) -> None:
    (run / "tokenizer.json").write_text("{}")
    assert andreactl.main(["tokenizer", "train", "--run-dir", str(run), "--vocab-size", "300"]) == 2
    assert "tokenizer.json exists: remove it first" in capsys.readouterr().err
    (run / "run.toml").unlink()
    assert andreactl.main(["tokenizer", "train", "--run-dir", str(run), "--vocab-size", "300"]) == 2
    assert "run.toml does not exist" in capsys.readouterr().err


def test_encode_with_a_tokenizer_that_cannot_encode_is_exit_2(tmp_path: Path, capsys) -> None:
    """A WordLevel without [UNK] fails on the first word it lacks; a vocabulary with one id at
    100,000,000 is refused before anything is built. Both name the tokenizer, without a traceback."""
    (tmp_path / "in.txt").write_text(PROSE)
    out = tmp_path / "out.u16"
    for tok, needle in (
        (word_level_file(tmp_path / "wl.json", ["The"]), "cannot encode the data (WordLevel"),
        (sparse_bpe_file(tmp_path / "sparse.json"), "2 tokens with ids up to 100,000,000"),
    ):
        argv = ["tokenizer", "encode", "--tokenizer", str(tok), "--input", str(tmp_path / "in.txt")]
        assert ctl(*argv, "--out", str(out)) == 2
        err = capsys.readouterr().err
        assert f"[data] tokenizer = '{tok}'" in err and needle in err, err
        assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_a_tokenizer_that_drops_text_is_said_with_its_figures(tmp_path: Path, capsys) -> None:
    """A BPE of two ids without a byte alphabet keeps only "a" and "e": encode warns, giving
    bytes per token and the share decoded back; a byte-level BPE (the negative control) does not."""
    (tmp_path / "in.txt").write_text(PROSE * 50)
    argv = ["--json", "tokenizer", "encode", "--input", str(tmp_path / "in.txt")]
    two = two_id_bpe_file(tmp_path / "two.json")
    assert andreactl.main([*argv, "--tokenizer", str(two), "--out", str(tmp_path / "a.u8")]) == 0
    report = TokenizerEncodeReport.model_validate_json(capsys.readouterr().out)
    size = len((PROSE * 50).encode())
    assert report.warning is not None, report
    assert f"{size:,} bytes became {report.tokens:,} tokens" in report.warning
    assert f"({size / report.tokens:.1f} bytes per token)" in report.warning
    assert "the tokenizer drops most of the text" in encode_text(report, "a", None)
    good = bpe_file(tmp_path / "bpe.json", [PROSE * 10])
    assert andreactl.main([*argv, "--tokenizer", str(good), "--out", str(tmp_path / "b.u16")]) == 0
    assert TokenizerEncodeReport.model_validate_json(capsys.readouterr().out).warning is None


def test_train_reports_a_tokenizer_that_drops_text(tmp_path: Path) -> None:
    """`tokenizer train` measures each arm's sample with the tokenizer it wrote; the rows (and
    the text) carry the warning when that tokenizer drops most of the text."""
    tally = _Tally("notes")
    tally.add(PROSE * 50, len((PROSE * 50).encode()))
    dropped = _arm_row(tally, load_tokenizer(str(two_id_bpe_file(tmp_path / "two.json")), tmp_path))
    assert dropped.warning is not None and "bytes per token" in dropped.warning
    kept = _arm_row(tally, load_tokenizer(str(bpe_file(tmp_path / "b.json", [PROSE])), tmp_path))
    assert kept.warning is None
    report = TokenizerTrainReport(time="2026-01-01T00:00:00Z", run_dir=".", out="t.json",
                                  sha256="0" * 64, n_vocab=2, model_vocab_size=64,
                                  heldout_fraction=None, arms=[dropped], seconds=1.0)  # fmt: skip
    assert f"warning: arm notes: {dropped.warning}" in train_text(report, tmp_path, "bytes")
