"""Benchmark of a first start's encoding: how it scales from one core to two, and how long a run's
first start takes on a large corpus before and after `andreactl tokenizer train` warms the cache.

    .venv/bin/python tests/bench/bench_encode_cores.py [--mb 200] [--sample-mb 16] [--rounds 4]
                                                       [--cores-only] [--dir DIR] [--out FILE.json]

The corpus is bench_tokenize.py's (the standard library's sources copied with renamed identifiers,
one text file per module and copy), `--mb` MB of it.

1. Cores: the arm encoder a first start runs (`daemon.encoding.write_arm`: read the files, split
   the held-out documents, encode with a byte-level BPE of 8,192 ids trained on the first 16 MB,
   write the cache files) over the first `--sample-mb` MB, in a fresh process pinned to one core
   (`taskset -c 0`, `RAYON_NUM_THREADS=1`: the tokenizer's threads) and to two (`taskset -c 0,1`),
   alternating, `--rounds` times each. The files the two write are compared byte for byte (the
   order of the ids never depends on the threads). Speedup: the median of the rounds' ratios.
2. First start, on the whole corpus, one text arm, andrea-tiny to its first step:
   - before: `andreactl tokenizer train --no-cache`, then the first start (which encodes);
   - after: `andreactl tokenizer train` (which encodes into the cache), then the first start
     (which verifies the cache and encodes nothing).
   Each with its own empty cache, back to back.

Not collected by pytest (bench_*.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_tokenize import corpus_files, first_step, make_corpus, train_tokenizer  # noqa: E402

_ENCODE = """
import sys, time
from pathlib import Path
from andrea.daemon.data.encoding import write_arm
from andrea.daemon.data.sources import text_documents
from andrea.daemon.data.tokenizer import load_tokenizer
files = [Path(p) for p in Path(sys.argv[1]).read_text().split("\\n")]
tok = load_tokenizer(sys.argv[2], Path("/"))
tok.separator  # the tokenizer loaded and warm before the clock starts
t0 = time.perf_counter()
write_arm(Path(sys.argv[3]), "bench", text_documents(files, Path(sys.argv[4])), tok, 0.05)
print(time.perf_counter() - t0)
"""


def encode_once(cores: str, listing: Path, tok: Path, out: Path, common: Path) -> float:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    env = {**os.environ, "RAYON_NUM_THREADS": str(len(cores.split(",")))}
    res = subprocess.run(
        [
            "taskset",
            "-c",
            cores,
            sys.executable,
            "-c",
            _ENCODE,
            str(listing),
            str(tok),
            str(out),
            str(common),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(res.stdout.split()[-1])


def cores(files: list[Path], tok: Path, work: Path, sample_bytes: int, rounds: int) -> dict:
    sample, size = [], 0
    for f in files:
        if size >= sample_bytes:
            break
        sample.append(f)
        size += f.stat().st_size
    listing = work / "sample.txt"
    listing.write_text("\n".join(str(f) for f in sample))
    common = Path(os.path.commonpath([f.parent for f in sample]))
    one, two = [], []
    for r in range(rounds):
        order = (("0", one), ("0,1", two)) if r % 2 == 0 else (("0,1", two), ("0", one))
        for pin, into in order:
            into.append(
                encode_once(
                    pin,
                    listing,
                    tok,
                    work / f"enc-{pin}",
                    common,
                )
            )
        print(f"round {r}: 1 core {one[-1]:.1f} s, 2 cores {two[-1]:.1f} s", flush=True)
    same = all(
        (work / "enc-0" / p.name).read_bytes() == p.read_bytes()
        for p in (work / "enc-0,1").iterdir()
    )
    ratios = sorted(a / b for a, b in zip(one, two, strict=True))
    mb = size / 1e6
    return {
        "sample_mb": round(mb, 1),
        "rounds": rounds,
        "one_core_s": [round(x, 1) for x in one],
        "two_cores_s": [round(x, 1) for x in two],
        "one_core_mb_per_s": round(mb / (sum(one) / rounds), 2),
        "two_cores_mb_per_s": round(mb / (sum(two) / rounds), 2),
        "speedup_median": round(ratios[len(ratios) // 2], 2),
        "identical_output": same,
    }


def _andreactl(*args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "andrea.control.andreactl", *args], check=True,
                   capture_output=True, text=True)  # fmt: skip
    return time.perf_counter() - t0


def first_start(corpus: Path, work: Path) -> dict:
    out = {}
    for label, warm in (("before", False), ("after", True)):
        run = work / f"run-{label}"
        cache = work / f"cache-{label}"
        run.mkdir()
        arm = f'[[data.arms]]\nname = "corpus"\nkind = "text"\npaths = ["{corpus}/**/*.txt"]\n'
        (run / "run.toml").write_text(arm)
        train = ["tokenizer", "train", "--run-dir", str(run), "--vocab-size", "8192"]
        train += ["--cache-dir", str(cache)] if warm else ["--no-cache"]
        trained = _andreactl(*train)
        (run / "run.toml").write_text('[data]\ntokenizer = "tokenizer.json"\n' + arm)
        started = first_step(run, cache, 1)
        out[label] = {
            "tokenizer_train_s": round(trained, 1),
            "first_start_s": round(started, 1),
            "total_s": round(trained + started, 1),
        }
        print(label, out[label], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=float, default=200)
    p.add_argument("--sample-mb", type=float, default=16)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--cores-only", action="store_true")
    p.add_argument("--dir", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-encode-"))
    corpus = work / "corpus"
    n_files, size = make_corpus(corpus, int(args.mb * 1e6))
    files = corpus_files(corpus)
    tok = work / "tokenizer.json"
    train_tokenizer(files, tok, 8192, 16_000_000)
    result: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
        "corpus_mb": round(size / 1e6, 1),
        "files": n_files,
    }
    result["cores"] = cores(files, tok, work, int(args.sample_mb * 1e6), args.rounds)
    print(json.dumps(result["cores"]), flush=True)
    if not args.cores_only:
        result["first_start"] = first_start(corpus, work)
    result["load_after"] = round(os.getloadavg()[0], 1)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
