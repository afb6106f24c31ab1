"""Every refusal of the data people bring, as a real trainer start sees it: the exit code and a
message that names what to change; `--check` gives the start's exit code on the same inputs (its
code run in this process, as the CLI runs it, and in a real process for one case of each kind).
(A stop while the data is being prepared, honoured at once: tests/process/test_data_process.py::
test_encoding_progress_is_in_status_and_a_stop_ends_it_within_a_second.)"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.data.tokenizer import load_tokenizer
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.trainer.service.cli import build_parser
from andrea.daemon.trainer.service.preflight import run_check
from tests.support import forkserver
from tests.support.daemons import Daemon, andreactl, trainer_args, trainer_cmd
from tests.support.owndata import (
    PROSE,
    bpe_file,
    names,
    sparse_bpe_file,
    two_id_bpe_file,
    word_level_file,
    write_jsonl,
)

TEXT_ARM = '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.txt"]\n'
#: The share of PROSE's characters (whitespace aside) that are "a" or "e": all a BPE of those two
#: tokens keeps of it.
AE_SHARE = sum(c in "ae" for c in PROSE) / len("".join(PROSE.split()))
TOKENS_ARM = '[[data.arms]]\nname = "pre"\nkind = "tokens"\npath = "pre.u16"\ndtype = "uint16"\n'


def _trainer(run: Path, cache: Path, *extra: str, timeout: float = 180):
    cmd = trainer_cmd(run, cache, "--max-steps", "2", "--checkpoint-every", "2", *extra)
    return forkserver.run(cmd, capture_output=True, text=True, timeout=timeout)


#: The cases whose `--check` runs as a real `andrea-trainer --check` process too: the CLI's own
#: path (its logging, its exit) for a refusal of the config and one of an arm's records.
REAL_CHECK = ("proc-self-glob", "jsonl-without-field")


def _check(
    case: str,
    run: Path,
    cache: Path,
    caplog: pytest.LogCaptureFixture,
    needles: list[str],
    *flags: str,
) -> int:
    """`andrea-trainer --check` on `run`: its exit code, what it logs holding each of `needles`.
    run_check in this process, as the CLI calls it; for REAL_CHECK, also the command itself,
    which must agree."""
    args = build_parser().parse_args(trainer_args(run, cache, "--check", *flags))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="andrea"):
        code = int(run_check(args))
    assert not any(r.exc_info for r in caplog.records), caplog.text
    for needle in needles:
        assert needle in caplog.text, (case, caplog.text)
    if case in REAL_CHECK:
        real = forkserver.run(trainer_cmd(run, cache, "--check", *flags),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert real.returncode == code, (case, real.stderr)
        assert "Traceback" not in real.stderr, real.stderr
        for needle in needles:
            assert needle in real.stderr, (case, real.stderr)
    return code


def _notes(run: Path, toml: str, tokenizer: bool = True) -> None:
    (run / "notes").mkdir(parents=True)
    for i in range(4):
        (run / "notes" / f"n{i}.txt").write_text(PROSE * 20)
    if tokenizer:
        bpe_file(run / "tokenizer.json", [PROSE * 10])
    (run / "run.toml").write_text(toml)


def _small_vocab(run: Path) -> None:
    _notes(run, f'[data]\ntokenizer = "tokenizer.json"\n[model]\nvocab_size = 100\n{TEXT_ARM}')


def _missing_tokenizer(run: Path) -> None:
    _notes(run, f'[data]\ntokenizer = "tok/none.json"\n{TEXT_ARM}', tokenizer=False)


def _two_tokenizers(run: Path) -> None:
    _notes(run, TEXT_ARM + TOKENS_ARM)  # the run's tokenizer: bytes; pre.u16: the BPE's
    tok = load_tokenizer("tokenizer.json", run)
    res = andreactl(None, "tokenizer", "encode", "--tokenizer", str(run / "tokenizer.json"),
                    "--out", str(run / "pre.u16"), "--input", str(run / "notes" / "n0.txt"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert tok.identity[:12] in (run / "pre.u16.json").read_text()


def _id_beyond_vocab(run: Path) -> None:
    run.mkdir()
    np.arange(300, dtype="<u2").repeat(200).tofile(run / "pre.u16")
    (run / "run.toml").write_text(TOKENS_ARM)


def _malformed_jsonl(run: Path) -> None:
    write_jsonl(run / "web" / "a.jsonl", [{"text": PROSE}] * 5)
    with open(run / "web" / "a.jsonl", "a") as f:
        f.write('{"text": "unterminated\n')
    (run / "run.toml").write_text(
        '[[data.arms]]\nname = "web"\nkind = "jsonl"\npaths = ["web/*"]\n'
    )


def _proc_self(run: Path) -> None:
    run.mkdir()
    (run / "run.toml").write_text(
        '[[data.arms]]\nname = "p"\nkind = "text"\npaths = ["/proc/self/*"]\n'
    )


def _word_level_without_unk(run: Path) -> None:
    _notes(run, f'[data]\ntokenizer = "tokenizer.json"\n{TEXT_ARM}', tokenizer=False)
    word_level_file(run / "tokenizer.json", ["The", "trainer", "reads"])


def _sparse_tokenizer(run: Path) -> None:
    _notes(run, f'[data]\ntokenizer = "tokenizer.json"\n{TEXT_ARM}', tokenizer=False)
    sparse_bpe_file(run / "tokenizer.json")


def _absurd_vocab(run: Path) -> None:
    _notes(run, f"[model]\nvocab_size = 100000000\n{TEXT_ARM}", tokenizer=False)


def _tokens_fifo(run: Path) -> None:
    run.mkdir()
    os.mkfifo(run / "pre.u16")
    (run / "run.toml").write_text(TOKENS_ARM)


def _drops_text(run: Path) -> None:
    _notes(run, f'[data]\ntokenizer = "tokenizer.json"\n{TEXT_ARM}', tokenizer=False)
    two_id_bpe_file(run / "tokenizer.json")


def _all_held_out(run: Path) -> None:
    (run / "notes").mkdir(parents=True)
    (run / "notes" / names("{}.txt", 0.99, True, 1)[0]).write_text(PROSE * 20)
    (run / "run.toml").write_text(TEXT_ARM)


CASES: dict[str, tuple[Callable[[Path], None], list[str], int, list[str]]] = {
    "vocab-smaller-than-tokenizer": (
        _small_vocab, [], ExitCode.CONFIG_ERROR,
        ["[model] vocab_size 100 is smaller than the 300 ids", "tokenizer = 'tokenizer.json'"],
    ),
    "tokenizer-missing": (
        _missing_tokenizer, [], ExitCode.CONFIG_ERROR,
        ["[data] tokenizer = 'tok/none.json'", "does not exist", "andreactl tokenizer train"],
    ),
    "arms-of-two-tokenizers": (
        _two_tokenizers, [], ExitCode.DATA_ERROR,
        ["different tokenizers: arm 'pre' by sha256", "[data] tokenizer = 'bytes'", "arms notes"],
    ),
    "id-beyond-vocab": (
        _id_beyond_vocab, [], ExitCode.DATA_ERROR,
        ["token id 299", "[model] vocab_size 256", "[data] tokenizer"],
    ),
    "malformed-jsonl-line": (
        _malformed_jsonl, [], ExitCode.DATA_ERROR, ["a.jsonl:6: not JSON"],
    ),
    "proc-self-glob": (_proc_self, [], ExitCode.CONFIG_ERROR, ["data: arm 'p': /proc/self/"]),
    "word-level-without-unk": (
        _word_level_without_unk, [], ExitCode.CONFIG_ERROR,
        ["[data] tokenizer = 'tokenizer.json'", "cannot encode the data", "[UNK]"],
    ),
    "sparse-tokenizer": (
        _sparse_tokenizer, [], ExitCode.CONFIG_ERROR,
        ["[data] tokenizer = 'tokenizer.json'", "2 tokens with ids up to 100,000,000",
         "[model] vocab_size"],
    ),
    "absurd-vocab-size": (
        _absurd_vocab, [], ExitCode.CONFIG_ERROR, ["vocab_size", "4194304"],
    ),
    "tokenizer-drops-text": (  # trained on, with a warning and its figures
        _drops_text, [], ExitCode.OK,
        ["WARNING arm notes: the tokenizer drops most of the text:", "bytes per token",
         f"which decode back to {AE_SHARE:.0%} of its"],
    ),
    "tokens-arm-fifo": (
        _tokens_fifo, [], ExitCode.CONFIG_ERROR,
        ["arm 'pre': token file", "is not a regular file (a FIFO)"],
    ),
    "heldout-fraction-0.99": (
        _all_held_out, ["--heldout-fraction", "0.99"], ExitCode.DATA_ERROR,
        ["0 training tokens", "[data] heldout_fraction holds out 1 of its 1 documents"],
    ),
}  # fmt: skip


#: The refusals of CASES that `--check` must give too (those that need the whole corpus read,
#: a malformed line further on or the held-out split, are the start's to find).
CHECKED_TOO = (
    "vocab-smaller-than-tokenizer", "tokenizer-missing", "arms-of-two-tokenizers",
    "id-beyond-vocab", "proc-self-glob",
)  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_refusal_names_what_to_change(
    case: str, tmp_path: Path, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The start's exit code and message; for CHECKED_TOO, `--check` on the same inputs exits
    with the same code (a file of /proc is the config's mistake, 2, not missing data)."""
    setup, flags, code, needles = CASES[case]
    run = tmp_path / "run"
    setup(run)
    if case in CHECKED_TOO:  # first: the check writes nothing, so both see the same inputs
        assert _check(case, run, cache_dir, caplog, needles[:1], *flags) == code, case
    started = time.monotonic()
    res = _trainer(run, cache_dir, *flags, timeout=120)
    assert res.returncode == code, res.stderr
    for needle in needles:
        assert needle in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "Errno" not in res.stderr, res.stderr
    print(f"{case}: exit {res.returncode} in {time.monotonic() - started:.1f} s")


def _jsonl_arm(
    run: Path, field: str | None, files: dict[str, list[dict]], gz: bool = False
) -> None:
    for name, rows in files.items():
        write_jsonl(run / "web" / name, rows, gz=gz)
    field_line = f'field = "{field}"\n' if field else ""
    (run / "run.toml").write_text(
        f'[[data.arms]]\nname = "web"\nkind = "jsonl"\npaths = ["web/*"]\n{field_line}'
    )


PAGES = [{"page": PROSE * 4}] * 5


def _huge_note(run: Path) -> None:
    (run / "notes").mkdir(parents=True)
    (run / "notes" / "small.txt").write_text(PROSE)
    (run / "notes" / "huge.txt").write_text("x" * 2048)
    (run / "run.toml").write_text(f"[data]\nmax_document_bytes = 1024\n{TEXT_ARM}")


def _hub_without_text(run: Path) -> None:
    """A Hub dataset whose text column is "content" (as code datasets name it), and an arm that
    leaves field out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (run / "data").mkdir(parents=True)
    table = pa.table({"id": [1, 2], "content": [PROSE, PROSE]})
    pq.write_table(table, run / "data" / "train-00000-of-00001.parquet")
    (run / "run.toml").write_text(
        '[[data.arms]]\nname = "hub"\nkind = "parquet"\npaths = ["data/train-*.parquet"]\n'
    )


#: Inputs whose refusal only a read of the arm's records finds: (setup, exit code, what the
#: error names), for `--check` and the start alike.
FIRST_RECORD_CASES: dict[str, tuple[Callable[[Path], None], int, list[str]]] = {
    "jsonl-without-field": (
        lambda run: _jsonl_arm(run, None, {"a.jsonl": PAGES}), ExitCode.DATA_ERROR,
        ["arm 'web'", "a.jsonl:1", "no field 'text' (its fields: page)"],
    ),
    "jsonl-gz-other-field": (
        lambda run: _jsonl_arm(run, "body", {"a.jsonl.gz": PAGES}, gz=True), ExitCode.DATA_ERROR,
        ["arm 'web'", "a.jsonl.gz:1", "no field 'body'"],
    ),
    "jsonl-second-file-without-field": (
        lambda run: _jsonl_arm(
            run, "page", {"a.jsonl": PAGES, "b.jsonl": [{"text": PROSE}] * 3}
        ),
        ExitCode.DATA_ERROR,
        ["arm 'web'", "b.jsonl:1", "no field 'page'"],
    ),
    "jsonl-null-field": (
        lambda run: _jsonl_arm(run, "page", {"a.jsonl": [{"page": None}, *PAGES]}),
        ExitCode.DATA_ERROR,
        ["arm 'web'", "a.jsonl:1", "field 'page'"],
    ),
    # A text file is one document, bounded as a JSON Lines line is (issue 50, M5: it was read
    # whole, then "out of memory", exit 2, naming neither the arm nor the file).
    "text-document-over-the-bound": (
        _huge_note, ExitCode.DATA_ERROR,
        ["arm 'notes': ", "huge.txt: a text document of 2,048 bytes, longer than 1,024"],
    ),
    # The check said "check passed" (exit 0) where the start found 0 training tokens (exit 5).
    "jsonl-empty": (
        lambda run: _jsonl_arm(run, None, {"a.jsonl": [], "b.jsonl": []}), ExitCode.DATA_ERROR,
        ["arm 'web' has 0 training tokens, fewer than one chunk of 65"],
    ),
    "parquet-without-the-column": (
        _hub_without_text, ExitCode.DATA_ERROR,
        ["arm 'hub'", "train-00000-of-00001.parquet: no column 'text' (its columns: id, content)"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", FIRST_RECORD_CASES)
def test_check_exits_as_the_start_would_on_an_arms_records(
    case: str, tmp_path: Path, cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`andrea-trainer --check` reads the first record of every file of every arm: a refusal the
    start would give there, the check gives too, with the start's exit code, naming the arm and
    the file (it used to say "check passed")."""
    setup, code, needles = FIRST_RECORD_CASES[case]
    run = tmp_path / "run"
    setup(run)
    checked = _check(case, run, cache_dir, caplog, needles)
    start = _trainer(run, cache_dir, timeout=120)
    assert start.returncode == code, start.stderr
    assert checked == start.returncode, case


def test_samples_the_proxy_cannot_write_never_stop_the_run(tmp_path: Path, cache_dir: Path) -> None:
    """Samples are an audit: a .samples.json that cannot be written is logged, and both daemons
    train on to the end."""
    run = tmp_path / "run"
    t = Daemon(trainer_cmd(run, cache_dir, "--with-proxy", "--max-steps", "30", "--sample-every",
                           "10", "--checkpoint-every", "0"))  # fmt: skip
    t.wait_for(r"sample at step 10", timeout=120)
    deadline = time.monotonic() + 60
    while not (run / ".samples.json").is_file():
        assert time.monotonic() < deadline, t.log
        time.sleep(0.05)
    (run / ".samples.json").unlink()
    (run / ".samples.json").mkdir()  # the next write of the samples fails
    assert t.wait() == 0, t.log
    assert "the samples of step 20 could not be written" in t.log, t.log
    assert "step 30/30" in t.log and "proxy stopped" in t.log, t.log


@pytest.mark.skipif(
    Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
    reason="memory is overcommitted: an allocation that cannot fit is granted, then killed",
)
def test_a_model_that_cannot_be_allocated_exits_2(tmp_path: Path, cache_dir: Path) -> None:
    """3.3 TB of attention weights (n_embd 2^19): torch's CPU allocator refuses them at the model's
    build, and the trainer exits 2 (not restarted), without a traceback. (The embeddings built
    before them, 0.6 GB, are allocated and filled: at 2^20, 1.5 s more CPU, 4.5 s in all.)"""
    run = tmp_path / "run"
    _notes(run, f"[model]\nn_embd = 524288\nn_head = 1\n{TEXT_ARM}", tokenizer=False)
    res = _trainer(run, cache_dir, timeout=120)
    assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
    assert "out of memory" in res.stderr and "DefaultCPUAllocator" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
