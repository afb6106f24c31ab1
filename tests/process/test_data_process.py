"""Hostile data and a hostile cache as a real trainer and a real `andreactl tokenizer` meet them: a
gzip bomb refused in bounded memory (exit 5), lone surrogates replaced, the encoding's progress in
`andreactl status` and a SIGTERM honoured within a second meanwhile, a full cache that names its
directory and leaves nothing behind, and a first start that finds the cache `tokenizer train`
warmed."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from andrea.daemon.config import build_config
from andrea.daemon.data.arms import arm_identity
from andrea.daemon.data.encoding import split_paths
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, andreactl, trainer_cmd
from tests.support.owndata import PROSE, bpe_file, gzip_bomb

JSONL_ARM = '[[data.arms]]\nname = "web"\nkind = "jsonl"\npaths = ["web/*"]\n'
TEXT_ARM = '[[data.arms]]\nname = "notes"\nkind = "text"\npaths = ["notes/*.txt"]\n'
SURROGATES = '{"text": "lone \\ud800 x %d %s"}\n'


#: Runs its arguments as a command and prints the command's peak resident memory (KiB).
_PEAK_RSS = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def _trainer(run: Path, cache: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    cmd = trainer_cmd(run, cache, "--max-steps", "2", "--checkpoint-every", "2", *extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)


def _surrogate_run(run: Path) -> None:
    (run / "web").mkdir(parents=True)
    rows = "".join(SURROGATES % (i, PROSE[: 200 + i]) for i in range(400))
    (run / "web" / "a.jsonl").write_text(rows, encoding="ascii")
    (run / "run.toml").write_text(JSONL_ARM)


def test_a_gzip_bomb_is_a_data_error_in_bounded_memory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "web").mkdir(parents=True)
    gzip_bomb(run / "web" / "bomb.jsonl.gz", 1024)  # 1 GiB of NUL bytes, no newline
    (run / "run.toml").write_text(JSONL_ARM)
    cmd = trainer_cmd(run, tmp_path / "cache", "--max-steps", "2")
    res = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, *cmd], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == ExitCode.DATA_ERROR, res.stderr
    assert "bomb.jsonl.gz:1: a line longer than 67,108,864 bytes" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    # The trainer's imports take a few hundred MB; the 1 GiB line is never held.
    peak_kib = int(res.stdout.split()[-1])
    assert peak_kib < 1 << 20, f"{peak_kib / 1024:.0f} MiB resident at peak"
    # The same bound in the tool: a usage error (exit 2) naming the file and line, no traceback.
    res = andreactl(None, "tokenizer", "encode", "--tokenizer", "bytes", "--out", str(tmp_path / "o.u8"),
                    "--input", str(run / "web" / "bomb.jsonl.gz"), "--max-document-bytes", "100000")  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "bomb.jsonl.gz:1: a line longer than 100,000 bytes" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "o.u8").exists()


def test_surrogates_train_and_the_trained_tokenizer_warms_the_cache(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _surrogate_run(run)
    cache = tmp_path / "cache"
    res = andreactl(run, "tokenizer", "train", "--vocab-size", "300", "--cache-dir", str(cache))
    assert res.returncode == 0, res.stderr
    assert "lone surrogate escape(s) (first on line 1) replaced by U+FFFD" in res.stderr
    assert f"into the token cache {cache}" in res.stdout, res.stdout
    (run / "run.toml").write_text('[data]\ntokenizer = "tokenizer.json"\n' + JSONL_ARM)
    res = _trainer(run, cache)
    assert res.returncode == 0, res.stderr
    # The first start finds the entries the tool wrote: it encodes nothing.
    assert "encoding arm" not in res.stderr and "step 2" in res.stderr, res.stderr
    # encode takes the same file.
    out = tmp_path / "web.u16"
    res = andreactl(run, "tokenizer", "encode", "--input", str(run / "web" / "a.jsonl"), "--out", str(out))  # fmt: skip
    assert res.returncode == 0 and out.stat().st_size > 0, res.stderr


def test_surrogates_in_a_first_start_under_bytes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _surrogate_run(run)
    res = _trainer(run, tmp_path / "cache")
    assert res.returncode == 0, res.stderr
    assert "400 lone surrogate escape(s)" in res.stderr


def test_encoding_progress_is_in_status_and_a_stop_ends_it_within_a_second(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "notes").mkdir(parents=True)
    bpe_file(run / "tokenizer.json", [PROSE * 10])
    for i in range(60):  # 30 MB: tens of seconds of encoding under a BPE on 2 busy cores
        (run / "notes" / f"big{i}.txt").write_text(f"{i} {PROSE}" * 2500)
    (run / "run.toml").write_text('[data]\ntokenizer = "tokenizer.json"\n' + TEXT_ARM)
    cache = tmp_path / "cache"
    t = Daemon(trainer_cmd(run, cache, "--max-steps", "2"))
    t.wait_for(r"encoding arm notes", timeout=180)
    preparing = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        res = andreactl(run, "status", "-o", "json")
        trainer = json.loads(res.stdout).get("trainer") or {}
        preparing = trainer.get("preparing")
        if preparing and preparing["bytes_done"] > 0 and preparing["documents"] > 0:
            break
        time.sleep(0.2)
    assert preparing is not None and preparing["arm"] == "notes", preparing
    assert preparing["bytes_total"] == sum(f.stat().st_size for f in (run / "notes").iterdir())
    assert preparing["bytes_done"] <= preparing["bytes_total"]
    text = andreactl(run, "status").stdout
    assert "data: arm notes: encoding," in text and "documents)" in text, text
    # A checkpoint awaited during the start is answered when the stop ends it (it waited out
    # its 3,600 s before), not a moment later.
    waiting = subprocess.Popen(
        [sys.executable, "-m", "andrea.control.andreactl", "--run-dir", str(run)]
        + ["checkpoint", "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    t.wait_for(r"control: checkpoint requested \(the client waits\)", timeout=30)
    t.signal(signal.SIGTERM)
    sent = time.monotonic()
    assert t.wait(30) == 0, t.log
    waited = time.monotonic() - sent
    assert waited < 1.0, f"{waited:.2f} s from SIGTERM to exit during encoding"
    assert "stop requested during start-up" in t.log, t.log
    out, _ = waiting.communicate(timeout=30)
    assert waiting.returncode == 1, out
    assert "no checkpoint: stopped during start-up" in out, out
    assert not list(cache.glob("*.tmp")) and not list(cache.glob("*.u16")), list(cache.iterdir())
    print(f"SIGTERM during encoding: exit 0 after {waited:.2f} s")


def _limit_file_size(limit: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def test_a_full_cache_names_its_directory_and_leaves_no_temporary(tmp_path: Path) -> None:
    """RLIMIT_FSIZE fails the cache's writes past 256 kB (EFBIG) as a full disk fails them (ENOSPC),
    in the real trainer, without a filesystem of its own (no root, no mount)."""
    run = tmp_path / "run"
    (run / "notes").mkdir(parents=True)
    for i in range(8):
        (run / "notes" / f"n{i}.txt").write_text(f"{i} {PROSE}" * 300)
    (run / "run.toml").write_text(TEXT_ARM)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "dead.u8.999999999.tmp").write_bytes(b"left by a writer killed mid-write")
    for _ in range(2):  # a restart neither leaves nor piles up temporaries
        res = _trainer(run, cache, preexec_fn=_limit_file_size(256 << 10))
        assert res.returncode == ExitCode.CONFIG_ERROR, res.stderr
        assert f"cannot write the token cache in {cache}" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
        assert not list(cache.glob("*.tmp")), list(cache.iterdir())
    res = _trainer(run, cache)
    assert res.returncode == 0, res.stderr
    assert not list(cache.glob("*.tmp")) and list(cache.glob("*.entry.json"))


def test_the_exit_code_when_python_itself_cannot_write(tmp_path: Path) -> None:
    """The limit test's premise: past RLIMIT_FSIZE a write fails (Python ignores SIGXFSZ)."""
    res = subprocess.run(
        [sys.executable, "-c", f"open({str(tmp_path / 'f')!r}, 'wb').write(bytes(1 << 20))"],
        preexec_fn=_limit_file_size(1 << 16),
        capture_output=True,
        text=True,
    )
    assert res.returncode == 1 and "File too large" in res.stderr, res.stderr


_ENCODE_WITH_THREADS = """
import sys
from pathlib import Path
from andrea.daemon.config import DataConfig
from andrea.daemon.data.arms import load_arms
root = Path(sys.argv[1])
cfg = DataConfig.model_validate({
    "arms": [{"name": "notes", "kind": "text", "paths": ["notes/*.txt"]},
             {"name": "web", "kind": "jsonl", "paths": ["web/*"]}],
    "cache_dir": sys.argv[2], "tokenizer": "tokenizer.json", "heldout_fraction": 0.1})
load_arms(cfg, root, 320)
"""


def test_encoding_on_one_thread_or_many_writes_the_same_cache(tmp_path: Path) -> None:
    """The tokenizer encodes a batch on every core (its own threads); the ids, the token streams
    and the cache files never depend on how many: one thread and four write the same bytes."""
    run = tmp_path / "run"
    _surrogate_run(run)
    (run / "notes").mkdir()
    for i in range(30):
        (run / "notes" / f"n{i}.txt").write_text(f"{i} {PROSE}" * (20 + i))
    bpe_file(run / "tokenizer.json", [PROSE * 10])
    caches = {}
    for threads in ("1", "4"):
        cache = tmp_path / f"cache{threads}"
        subprocess.run(
            [sys.executable, "-c", _ENCODE_WITH_THREADS, str(run), str(cache)],
            env={**os.environ, "RAYON_NUM_THREADS": threads},
            check=True,
            timeout=300,
        )
        # Each entry's lock file (empty) aside.
        caches[threads] = {
            p.name: p.read_bytes() for p in sorted(cache.iterdir()) if p.suffix != ".lock"
        }
    assert len(caches["1"]) == 8  # two arms: tokens, held-out tokens, counts, record
    assert caches["1"] == caches["4"]


def test_runs_sharing_a_cache_wait_for_the_arm_another_is_encoding(tmp_path: Path) -> None:
    """Two trainers (two runs here, or the ranks of a job) start on one cache while a third process
    encodes their arm: both wait for it, leave its half-written entry alone, then one encodes the
    arm and the other uses that entry. Without the entry's lock a rank took another's entry, half
    written, for a damaged one, removed it under its writer, and the job failed at its start."""
    cache = tmp_path / "cache"
    cache.mkdir()
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        (run / "notes").mkdir(parents=True)
        for i in range(20):
            (run / "notes" / f"n{i}.txt").write_text(f"{i} {PROSE}" * (10 + i))
        (run / "run.toml").write_text("[data]\nheldout_fraction = 0.05\n" + TEXT_ARM)
    arm = {"name": "notes", "kind": "text", "paths": ["notes/*.txt"]}
    cfg = build_config(
        {"data": {"arms": [arm], "heldout_fraction": 0.05}},
        {"preset": "andrea-tiny", "data": {"cache_dir": str(cache)}},
    )
    identity = arm_identity(cfg.data.arms[0], cfg.data, runs[0], cfg.model.vocab_size)
    assert identity == arm_identity(cfg.data.arms[0], cfg.data, runs[1], cfg.model.vocab_size)
    half = split_paths(cache, identity, "u8")[0]
    lock = os.open(cache / f"{identity}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the writer, mid-way: tokens written, no record yet
        half.write_bytes(b"\0" * 4096)
        trainers = [
            Daemon(trainer_cmd(run, cache, "--max-steps", "2", "--checkpoint-every", "2"))
            for run in runs
        ]
        for t in trainers:
            t.wait_for(r"arm notes: another process is encoding it into .*; waiting", 120)
        time.sleep(0.5)
        assert half.read_bytes() == b"\0" * 4096, "an entry was touched under its writer"
        assert all(t.proc.poll() is None for t in trainers)
    finally:
        os.close(lock)  # the writer dies before its record: its entry is record-less
    for t in trainers:
        assert t.wait(120) == ExitCode.OK, t.log
    logs = [t.log for t in trainers]
    assert sum("encoding arm notes" in log for log in logs) == 1, logs
    assert sum("removing the entry and encoding the arm again" in log for log in logs) == 1
    for run in runs:  # both trained on the entry the cache now holds
        manifest = json.loads((run / "step_000002.json").read_text())
        assert [d["identity"] for d in manifest["data"]] == [identity]
