"""Benchmark of the data path under a subword tokenizer: encoding throughput against calling the
`tokenizers` batch encoder directly, and andrea-trainer's time to its first step on a large text
corpus, cold and warm cache.

    .venv/bin/python tests/bench/bench_tokenize.py [--mb 200] [--throughput-mb 32] [--vocab 8192]
                                                   [--dir DIR] [--out FILE.json]

The corpus is generated deterministically in a temporary directory (or DIR): the Python standard
library's sources, copied again and again with the common identifiers of each copy renamed, one
text file per module and copy, until it holds `--mb` MB. A byte-level BPE of `--vocab` ids is trained
(as `andreactl tokenizer train` trains one) on its first 16 MB.

1. Throughput, on the first `--throughput-mb` MB of documents, cut into `--rounds` slices; each
   slice is encoded the three ways back to back, in a rotating order (so that the load of a shared
   machine hits them alike):
   - direct: the documents already in memory as strings, one `Tokenizer.encode_batch_fast` call
     (the library's own fastest batch path, its threads on every core), ids not even copied out;
   - arm: `daemon.encoding.write_arm`, what a trainer's first start does: read the files (regular
     files only), split the held-out documents, encode in batches, write the two cache files;
   - encode: `write_tokens_file`, what `andreactl tokenizer encode` does.
   Each is reported in MB of text per second, and as a ratio to direct: the median of the slices'
   ratios of wall time, the ratio of the totals, and the ratio of CPU time (every thread's).
2. Time to first step: `andrea-trainer --max-steps 1` on a run whose one text arm is the whole
   corpus, from the process's start to its first progress line: cold (an empty cache: hashing,
   reading and encoding every file), warm (a new run over the same cache: hashing only), and a
   restart of the cold run (it resumes from its checkpoint). Then the same with the byte-level
   tokenizer, for comparison.

Not collected by pytest (bench_*.py); it runs minutes on two cores.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Common identifiers renamed in each copy, so that no two copies of a module are the same text.
_RENAMED = re.compile(r"\b(self|value|name|result|data|path|args|key|item|line)\b")


def make_corpus(root: Path, target_bytes: int) -> tuple[int, int]:
    """Write the corpus under `root` (deterministic); (files, bytes)."""
    from andrea.daemon.data.corpus import stdlib_files, stdlib_root

    lib = stdlib_root()
    sources = [
        (p.relative_to(lib).as_posix(), p.read_text("utf-8", "replace")) for p in stdlib_files(lib)
    ]
    files = written = copy = 0
    while written < target_bytes:
        folder = root / f"copy{copy:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for rel, text in sources:
            body = _RENAMED.sub(lambda m, c=copy: f"{m.group(1)}_{c}", text)
            data = f"# {rel}, copy {copy}\n{body}".encode()
            (folder / (rel.replace("/", "__") + ".txt")).write_bytes(data)
            files += 1
            written += len(data)
            if written >= target_bytes:
                break
        copy += 1
    return files, written


def corpus_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.txt"))


def train_tokenizer(files: list[Path], out: Path, vocab: int, sample_bytes: int) -> float:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts, size = [], 0
    for f in files:
        if size >= sample_bytes:
            break
        texts.append(f.read_text())
        size += f.stat().st_size
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    t0 = time.perf_counter()
    tok.train_from_iterator(texts, trainer)
    tok.save(str(out))
    return time.perf_counter() - t0


def _slice(files: list[Path], size: int) -> list[Path]:
    out, total = [], 0
    for f in files:
        if total >= size:
            break
        out.append(f)
        total += f.stat().st_size
    return out


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process's every thread) of `fn()`."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def _one_way(
    way: str, r: int, part: list[Path], common: Path, texts: list[str], tok, work: Path
) -> None:
    from andrea.daemon.data.encoding import write_arm, write_tokens_file
    from andrea.daemon.data.sources import text_documents

    if way == "direct":
        tok.hf.encode_batch_fast(texts, add_special_tokens=False)
    elif way == "arm":
        (work / f"cache{r}").mkdir()
        write_arm(work / f"cache{r}", "bench", text_documents(part, common), tok, 0.05)
    else:
        write_tokens_file(work / f"out{r}.u16", text_documents(part, common), tok, ["bench"])


def throughput(files: list[Path], tokenizer_path: Path, work: Path, rounds: int) -> dict:
    """The three ways over the same documents, in `rounds` slices; within a slice they run back to
    back in a rotating order, so that the load of a shared machine hits them alike, and each
    slice gives a ratio. The medians of those ratios, and the totals."""
    from andrea.daemon.data.encoding import read_record
    from andrea.daemon.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_path), Path("/"))
    size = sum(f.stat().st_size for f in files)
    slices = [files[i::rounds] for i in range(rounds)]
    ways = ("direct", "arm", "encode")
    wall = {k: [] for k in ways}
    cpu = {k: [] for k in ways}
    tokens = 0
    for r, part in enumerate(slices):
        common = Path(os.path.commonpath([f.parent for f in part]))
        texts = [f.read_text() for f in part]
        for k in ways[r % 3 :] + ways[: r % 3]:
            w, c = _timed(functools.partial(_one_way, k, r, part, common, texts, tok, work))
            wall[k].append(w)
            cpu[k].append(c)
        record = read_record(work / f"out{r}.u16")
        tokens += record.tokens if record is not None else 0
    mb = size / 1e6

    def median_ratio(times: dict[str, list[float]], k: str) -> float:
        ratios = sorted(d / x for d, x in zip(times["direct"], times[k], strict=True))
        return round(ratios[len(ratios) // 2], 3)

    return {
        "documents": len(files),
        "mb": round(mb, 1),
        "rounds": rounds,
        "tokens": tokens,  # documents joined: separators included
        "bytes_per_token": round(size / tokens, 3),
        "wall_s": {k: round(sum(v), 1) for k, v in wall.items()},
        "cpu_s": {k: round(sum(v), 1) for k, v in cpu.items()},
        "mb_per_s": {k: round(mb / sum(v), 2) for k, v in wall.items()},
        "ratio_to_direct_wall_median": {k: median_ratio(wall, k) for k in ways},
        "ratio_to_direct_wall_total": {
            k: round(sum(wall["direct"]) / sum(wall[k]), 3) for k in ways
        },
        "ratio_to_direct_cpu_total": {k: round(sum(cpu["direct"]) / sum(cpu[k]), 3) for k in ways},
    }


def first_step(run: Path, cache: Path, steps: int) -> float:
    """Seconds from the start of `andrea-trainer` to its progress line of step `steps`."""
    cmd = [sys.executable, "-m", "andrea.daemon.trainer.service.cli", "--run-dir", str(run),
           "--max-steps", str(steps), "--log-every", "1", "--threads", "2", "--cache-dir",
           str(cache), "--checkpoint-every", "0", "--sample-every", "0", "--eval-every", "0"]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    seen = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if seen is None and f"step {steps}/{steps} |" in line:
            seen = time.perf_counter() - t0
    if proc.wait() != 0 or seen is None:
        raise RuntimeError(f"{cmd} exited {proc.returncode} without a step")
    return seen


def time_to_first_step(corpus: Path, tokenizer: str, work: Path, label: str) -> dict:
    def run_dir(name: str) -> Path:
        d = work / f"{label}-{name}"
        d.mkdir()
        (d / "run.toml").write_text(
            f'[data]\ntokenizer = "{tokenizer}"\n[[data.arms]]\nname = "corpus"\nkind = "text"\n'
            f'paths = ["{corpus}/**/*.txt"]\n'
        )
        return d

    cache = work / f"{label}-cache"
    cold_run = run_dir("cold")
    cold = first_step(cold_run, cache, 1)
    warm = first_step(run_dir("warm"), cache, 1)
    restart = first_step(cold_run, cache, 2)
    return {"cold_s": round(cold, 1), "warm_s": round(warm, 1), "restart_s": round(restart, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=200, help="size of the generated corpus")
    p.add_argument("--throughput-mb", type=float, default=32)
    p.add_argument("--rounds", type=int, default=12, help="slices of the throughput sample")
    p.add_argument("--throughput-only", action="store_true", help="skip the time to first step")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dir", type=Path, help="work here instead of a temporary directory")
    p.add_argument("--out", type=Path, help="also write the results as JSON")
    args = p.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-tokenize-"))
    corpus = work / "corpus"
    t0 = time.perf_counter()
    n_files, size = make_corpus(corpus, int(args.mb * 1e6))
    files = corpus_files(corpus)
    print(
        f"corpus: {n_files} files, {size / 1e6:.1f} MB in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    tok = work / "tokenizer.json"
    trained = train_tokenizer(files, tok, args.vocab, 16_000_000)
    print(f"tokenizer: {args.vocab} ids trained on 16 MB in {trained:.1f} s", flush=True)
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "corpus_mb": round(size / 1e6, 1),
        "files": n_files,
        "vocab": args.vocab,
    }
    sample = _slice(files, int(args.throughput_mb * 1e6))
    result["throughput"] = throughput(sample, tok, work, args.rounds)
    print(json.dumps(result["throughput"], indent=1), flush=True)
    if not args.throughput_only:
        result["first_step_subword"] = time_to_first_step(corpus, str(tok), work, "subword")
        print("subword:", result["first_step_subword"], flush=True)
        result["first_step_bytes"] = time_to_first_step(corpus, "bytes", work, "bytes")
        print("bytes:", result["first_step_bytes"], flush=True)
    result["load_after"] = round(os.getloadavg()[0], 1)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
