"""Mixing quality: the bandit's rewards against uniform mixtures, on sets of arms (cases).

    nice -n 10 .venv/bin/python tests/bench/bench_mixing.py [--steps 1500] [--batch-size 32]
        [--seeds 1 2 3 4 5]
        [--cases a b c d e f g h i s] [--mixtures gated-plateau gated-fall gated-heldout gated-learnability-2 gated-learnability learnability loss
        uniform-paired uniform-learnable-paired uniform uniform-learnable] [--jobs 2]
        [--eval-sequences 128] [--threads 1] [--out-dir DIR] [--reuse OLD/mixing.json]
        [--keep-runs DIR] [--small-package json]

Cases (arms; the held-out loss that counts is the mean over the three learnable stdlib arms):
- a: docstrings, code, comments (the embedded corpus);
- b: the three plus `random`, 300 files of 4,096 random bytes (irreducible loss ln 256 = 5.55 nats);
- c: the three plus `dup`, 300 copies of one 45-byte sentence (learnt to its floor, then worthless);
- d: the three plus `letters`, letters drawn independently with fixed odds (1.21 nats: learnt
  within a few hundred steps, then a flat, noisy curve);
- e: the three plus `synth8`, an order-2 chain over eight capital letters (learnable all run long,
  and of no use to the other three);
- s: a small target, `small` (the code of the json package, 27 kB, or of --small-package), beside
  `large` (the code of the rest of the standard library, 6 MB: the same register, it helps) and
  `synth8` (it does not); the held-out loss that counts is the small arm's.
- f, h: more of e's class (learnable, of no use to the three): `chain16`, an order-2 chain over
  sixteen capitals; `chain8s`, e's chain with a preferred letter 31 times in 32;
- i: the three plus `logs`, a generated web server's access log (a clock, workers, paths, request
  ids, statuses, latencies): e's class, harsher (gated-heldout gave it more of the second half);
- g: `memo`, one 1,024-letter passage (16 letters) repeated in every file. Meant for e's class; at
  andrea-tiny it is memorised too slowly for the gate to count it learnable (gated-heldout gave it
  0.04 of the second half), so it measures an arm between b's and e's.
The extra arms' files are generated deterministically (SHA-256 counter streams, fixed text) into the
work directory.

Mixtures, each a real `andrea-trainer` at andrea-tiny (5% of each arm's documents held out), the LR
decaying over the whole run (optim.decay_steps = --steps), batches of --batch-size sequences: 32 by
default, 2,048 tokens a step as in andrea-12m, so that each step's loss (all the bandit sees) averages
as many tokens as there; at the preset's 8 it averages a quarter as many (docs/mixing-quality.md):
- gated-plateau: `--with-proxy`, policy `reward = "gated-plateau"` (the default of new runs);
- gated-fall: `--with-proxy`, policy `reward = "gated-fall"` (the default before it);
- gated-heldout: `--with-proxy`, policy `reward = "gated-heldout"` (the default before that);
- gated-learnability-2: `--with-proxy`, policy `reward = "gated-learnability-2"`;
- gated-learnability: `--with-proxy`, policy `reward = "gated-learnability"` (the same gate, without
  measuring each arm first, exploring each arm eps_t / K whatever its steps bring);
- learnability: `--with-proxy`, policy `reward = "learnability"` (proportional to progress);
- loss: `--with-proxy`, policy `reward = "loss"` (ODM's reward);
- transfer, transfer-2: `--with-proxy`, a policy with a target (the three learnable arms; in case
  s the small arm) and that reward named (transfer-2 never lowers a target arm below its weight);
- grid-X (case s only): `--with-proxy`, paired as below, the small arm's share X, the large arm's
  1 - X, synth8 none: the grid of fixed mixtures the transfer reward is judged against;
- uniform-paired: `--with-proxy`, a policy whose floors and caps are all 1/K: uniform, drawn from
  the same per-step uniforms as the bandit's runs of the same seed, so that wherever a bandit mixes
  uniformly it trains on the very same steps (common random numbers: the difference between two
  mixtures is then theirs, not the luck of two draw streams);
- uniform-learnable-paired: the same, the extra arm capped at 0;
- uniform, uniform-learnable: `--mixing fixed` (the trainer's own draws), every arm weight 1, or
  the extra arm weight 0.
In case a, the "-learnable" mixtures are the uniform ones and are not run twice.

Case s runs transfer, uniform-paired and the grid only; the other cases never run the grid.
Reported per case: the mean held-out loss over the learnable arms at the last step (mean ± sd over
seeds, and seed by seed against uniform), each arm's share of the steps in the second half, and the
checks the mixing-quality page states. Every run also records each arm's share per 100 steps, the
held-out losses of every evaluation (every 100 steps), the least share an arm had over a 300-step
stretch across which its held-out loss rose, its arm of every step (`order`; for a bandit's run, the
steps it trained on another arm than the uniform-paired run of the same seed: `departures`), and in
cases c and d the steps from the extra arm's plateau to the bandit's seeing it
(`plateau_detection`). Also the bandit's own cost per step under each reward (observe + assign, in
process, 4 arms). Writes mixing.json and mixing.md to --out-dir.

Training is deterministic, so a run does not need repeating: `--reuse` takes, from an earlier
mixing.json of the same --steps and --batch-size, the runs of every (case, mixture, seed) this
invocation does not run (e.g. the uniform and loss runs, when only `--mixtures gated-learnability`
changed); mixing.json lists them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomli_w

from andrea.daemon.config import default_arms
from andrea.daemon.data.heldout import DEFAULT_FRACTION
from andrea.daemon.mixing.assignbook import AssignmentBook
from andrea.daemon.mixing.bandit import Bandit, ConfiguredArm
from andrea.daemon.mixing.policy import Policy
from andrea.daemon.rundir.evallog import canonical_evals, read_evals
from andrea.daemon.rundir.losslog import canonical_curve, read_entries

REWARDS = (
    "gated-plateau",
    "gated-fall",
    "gated-heldout",
    "gated-learnability-2",
    "gated-learnability",
    "learnability",
    "loss",
)
#: The bandit with a target (the learnable arms; in case s, the small arm): the transfer rewards,
#: each named in the policy.
TARGETED = ("transfer", "transfer-2")
#: Case s's grid of fixed mixtures, paired: the small target's share, the rest the larger arm's.
GRID = ("grid-1.00", "grid-0.75", "grid-0.50", "grid-0.25")
PAIRED = ("uniform-paired", "uniform-learnable-paired", *GRID)
FIXED = ("uniform", "uniform-learnable")
MIXTURES = (*REWARDS, *TARGETED, *PAIRED, *FIXED)
NEW = "gated-plateau"
LEARNABLE = ("code", "comments", "docstrings")
EXTRA = {
    "a": None,
    "b": "random",
    "c": "dup",
    "d": "letters",
    "e": "synth8",
    "f": "chain16",
    "g": "memo",
    "h": "chain8s",
    "i": "logs",
    "s": "synth8",
}
#: The cases whose extra arm is learnable all run long and teaches the other three nothing.
USELESS = ("e", "f", "h", "i")
#: Case s: a small target (the code of json, 27 kB, trained ~130 times over by target-only in 1,500
#: batches of 32), a larger arm of the same register (the code of the rest of the standard
#: library but pydoc_data and encodings, 6 MB) that helps it, and synth8, which does not.
SMALL, LARGE, SMALL_PACKAGE = "small", "large", "json"
#: Case s's documents, in bytes: the small arm's short, so that a small package holds some out.
SMALL_DOC, LARGE_DOC = 1024, 8192
#: The cases whose extra arm is learnt to a floor and then teaches nothing more.
PLATEAU = ("c", "d")
#: Steps per window of the shares reported step by step (and of the plateau's detection).
WINDOW = 100
#: An arm's plateau: the first step at which the mean of its last SMOOTH training losses is within
#: PLATEAU_MARGIN of its final (or lowest) value.
SMOOTH, PLATEAU_MARGIN = 10, 0.02
#: Or the first step at which it has come this fraction of the way from its first value to its final.
PLATEAU_FALL = 0.98
#: The stretch over which a rising held-out loss counts as forgetting.
RISE = 300
DUP_TEXT = b"The quick brown fox jumps over the lazy dog.\n"
#: Case d: letters drawn independently with these odds: an entropy of 1.21 nats per byte, learnt
#: (their frequencies) within the first hundred steps, then a flat, noisy curve at that floor.
LETTER_ODDS = {b"e": 128, b"t": 64, b"a": 32, b"o": 32}
#: Case e: an order-2 chain over eight capital letters, each pair followed by one of its own two
#: preferred letters 9 times in 10 (else by any of the eight): learnt steadily all run long
#: towards its floor at this size (about 0.8 nats), and nothing in it is Python. (Over all 26
#: capitals it learns slower than the stdlib arms and the bandit leaves it its uniform share.)
SYNTH_LETTERS = b"ABCDEFGH"


def _uniforms(tag: bytes):
    """An endless stream of bytes from a SHA-256 counter (the same on every machine)."""
    k = 0
    while True:
        yield from hashlib.sha256(b"%s:%d" % (tag, k)).digest()
        k += 1


def letters_text(i: int, size: int = 4096) -> bytes:
    """File i of case d's arm."""
    table = b"".join(letter * n for letter, n in LETTER_ODDS.items())  # 256 entries
    u = _uniforms(b"andrea.bench.letters:%d" % i)
    return bytes(table[next(u)] for _ in range(size))


def synth_text(i: int, size: int = 4096) -> bytes:
    """File i of case e's arm."""
    n = len(SYNTH_LETTERS)
    prefer = {}
    for a in SYNTH_LETTERS:
        for b in SYNTH_LETTERS:
            d = hashlib.sha256(b"andrea.bench.synth8:%d:%d" % (a, b)).digest()
            prefer[a, b] = (SYNTH_LETTERS[d[0] % n], SYNTH_LETTERS[d[1] % n])
    u = _uniforms(b"andrea.bench.synth8:%d" % i)
    out = bytearray(SYNTH_LETTERS[next(u) % n] for _ in range(2))
    while len(out) < size:
        r = next(u)
        if r < 230:  # 230/256 = 0.9: one of the pair's two letters
            out.append(prefer[out[-2], out[-1]][r & 1])
        else:
            out.append(SYNTH_LETTERS[next(u) % n])
    return bytes(out)


def scored(case: str) -> tuple[str, ...]:
    """The arms whose mean held-out loss a case's runs are judged by (and the transfer's target)."""
    return (SMALL,) if case == "s" else LEARNABLE


def code_chunks(text: str, size: int = 8192) -> list[str]:
    """A module's code as documents of about `size` bytes, cut at line ends: the held-out split
    is by document, and asyncio's 33 modules alone would hold none out."""
    out, cur = [], ""
    for line in text.splitlines(keepends=True):
        cur += line
        if len(cur) >= size:
            out.append(cur)
            cur = ""
    return [*out, cur] if cur else out


def write_code_arms(work: Path, small_package: str = SMALL_PACKAGE) -> None:
    """Case s's two arms of Python code: each standard-library module's code (without docstrings
    and comments), `small_package`'s in `small` in documents of 1 kB (json: 27 kB, 29 documents,
    4 held out: 4,022 bytes), the others' in `large` in documents of 8 kB. A package that matches
    no module is refused."""
    from andrea.daemon.data.corpus import split_source, stdlib_files, stdlib_root

    root = stdlib_root()
    files: dict[str, str] = {}
    for f in stdlib_files(root):
        rel = f.relative_to(root).as_posix()
        top = rel.split("/")[0]
        if top not in ("pydoc_data", "encodings"):  # data tables rather than code
            files[rel] = SMALL if top.removesuffix(".py") == small_package else LARGE
    if SMALL not in files.values():
        raise SystemExit(f"--small-package {small_package}: no such standard-library module")
    for rel, arm in files.items():
        (work / arm).mkdir(exist_ok=True)
        code = split_source((root / rel).read_text(encoding="utf-8", errors="replace"))["code"]
        for i, chunk in enumerate(code_chunks(code, SMALL_DOC if arm == SMALL else LARGE_DOC)):
            name = f"{rel.replace('/', '__')}.{i:03d}.txt"
            (work / arm / name).write_text(chunk, encoding="utf-8")


#: The other chains (cases f, g, h): (letters, order, odds of a preferred letter in 256).
CHAINS = {
    "chain16": (b"ABCDEFGHIJKLMNOP", 2, 230),
    "chain8s": (SYNTH_LETTERS, 2, 248),
}


def chain_text(name: str, i: int, size: int = 4096) -> bytes:
    """File i of a chain arm of CHAINS: each context of `order` letters followed by one of its
    own two preferred letters with the odds given, else by any letter."""
    letters, order, odds = CHAINS[name]
    n = len(letters)
    u = _uniforms(b"andrea.bench.%s:%d" % (name.encode(), i))
    out = bytearray(letters[next(u) % n] for _ in range(order))
    while len(out) < size:
        context = bytes(out[-order:])
        d = hashlib.sha256(b"andrea.bench.%s:%s" % (name.encode(), context)).digest()
        r = next(u)
        out.append(letters[d[r & 1] % n] if r < odds else letters[next(u) % n])
    return bytes(out)


#: Case g: one passage of MEMO_SIZE letters drawn uniformly from 16, every file that passage
#: repeated: nothing to learn but the passage itself, which the model memorises slowly all run long.
MEMO_SIZE = 1024


def memo_text(size: int = 4096) -> bytes:
    """Every file of case g's arm."""
    u = _uniforms(b"andrea.bench.memo")
    passage = bytes(b"ABCDEFGHIJKLMNOP"[next(u) % 16] for _ in range(MEMO_SIZE))
    return (passage * (size // MEMO_SIZE + 1))[:size]


#: Case i: a web server's access log, generated. Each line's clock advances by 0 to 6 seconds, and
#: its worker, path, request id, status and latency are drawn: the format and the clock's carries
#: are learnt all run long, the ids and latencies never, and nothing in it is Python. Under
#: gated-heldout it took more of the second half than case e's chain (docs/mixing-quality.md).
LOG_PATHS = ("/api/v2/items", "/api/v2/users", "/healthz", "/api/v2/orders", "/static/app.js")


def logs_text(i: int, size: int = 4096) -> bytes:
    """File i of case i's arm: access-log lines from an hour and minute drawn for the file."""
    u = _uniforms(b"andrea.bench.logs:%d" % i)
    t = 3600 * (next(u) % 24) + 60 * (next(u) % 60)
    out = b""
    while len(out) < size:
        t += next(u) % 7
        ms = next(u) * 4 % 1000
        clock = f"{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}.{ms:03d}"
        path = LOG_PATHS[next(u) % len(LOG_PATHS)]
        status = 200 if next(u) < 230 else (404 if next(u) & 1 else 500)
        worker, request = next(u) % 16, next(u) * 256 + next(u)
        latency = 1 + next(u) % 90
        out += (
            f"2026-03-14T{clock}Z worker-{worker:02d} INFO GET {path}/{request} {status} "
            f"{latency}ms\n"
        ).encode()
    return out[:size]


def write_inputs(work: Path, small_package: str = SMALL_PACKAGE) -> None:
    """The bandit's policies, and the random and duplicate arms' files (the same bytes on every
    machine); case s's small arm the code of `small_package`."""
    for reward in REWARDS:
        (work / f"policy-{reward}.toml").write_text(f'reward = "{reward}"\n')
    write_code_arms(work, small_package)
    for i in range(300):
        stream = b"".join(
            hashlib.sha256(b"andrea.bench.random:%d:%d" % (i, k)).digest() for k in range(128)
        )
        (work / "random").mkdir(exist_ok=True)
        (work / "random" / f"r{i:03d}.bin.txt").write_bytes(stream)
        (work / "dup").mkdir(exist_ok=True)
        (work / "dup" / f"d{i:03d}.txt").write_bytes(DUP_TEXT)
        for name, text in (("letters", letters_text), ("synth8", synth_text)):
            (work / name).mkdir(exist_ok=True)
            (work / name / f"{name[0]}{i:03d}.txt").write_bytes(text(i))
        for name in CHAINS:
            (work / name).mkdir(exist_ok=True)
            (work / name / f"c{i:03d}.txt").write_bytes(chain_text(name, i))
        (work / "logs").mkdir(exist_ok=True)
        (work / "logs" / f"l{i:03d}.txt").write_bytes(logs_text(i))
        (work / "memo").mkdir(exist_ok=True)
        (work / "memo" / f"m{i:03d}.txt").write_bytes(memo_text())


def run_config(case: str, mixture: str, seed: int, args: argparse.Namespace) -> dict:
    arms: list[dict] = [
        {"name": s.name, "kind": "stdlib", "part": s.part, "weight": 1.0} for s in default_arms()
    ]
    if case == "s":
        arms = [
            {"name": n, "kind": "text", "paths": [str(Path(args.work_dir) / n / "*.txt")]}
            for n in (SMALL, LARGE)
        ]
    extra = EXTRA[case]
    if extra is not None:
        weight = 0.0 if mixture == "uniform-learnable" else 1.0  # the proxy ignores weights
        paths = [str(Path(args.work_dir) / extra / "*.txt")]
        arms.append({"name": extra, "kind": "text", "paths": paths, "weight": weight})
    return {
        "preset": "andrea-tiny",
        "seed": seed,
        "max_steps": args.steps,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "samples": {"every": 0},
        "log_every": 500,
        "mixing": "fixed" if mixture in FIXED else "proxy",
        "optim": {"decay_steps": args.steps},
        "checkpoint": {"every": 0},
        # Every 100 steps, to see an arm being forgotten (evaluation never changes training), and
        # at the last step whatever --steps is.
        "eval": {"every": math.gcd(WINDOW, args.steps), "sequences": args.eval_sequences},
        "data": {"arms": arms, "heldout_fraction": DEFAULT_FRACTION, "windows": args.windows},
    }


def paired_policy(case: str, mixture: str) -> dict:
    """Floors and caps that pin every drawn arm at 1/K (the extra arm at 0 when it is left out);
    for a grid mixture of case s, the small arm at its share and the large arm at the rest."""
    extra = EXTRA[case]
    if mixture in GRID:
        x = float(mixture.removeprefix("grid-"))
        shares = {SMALL: x, LARGE: 1.0 - x, extra: 0.0}
        return {"reward": "loss", "arms": {n: {"floor": v, "cap": v} for n, v in shares.items()}}
    if case == "s":
        return {
            "reward": "loss",
            "arms": {n: {"floor": 1 / 3, "cap": 1 / 3} for n in (SMALL, LARGE, extra)},
        }
    drawn = [*LEARNABLE, *([extra] if extra and mixture == "uniform-paired" else [])]
    arms = {n: {"floor": 1.0 / len(drawn), "cap": 1.0 / len(drawn)} for n in drawn}
    if extra and extra not in drawn:
        arms[extra] = {"floor": 0.0, "cap": 0.0}
    return {"reward": "loss", "arms": arms}


#: The interpreter, told to receive SIGTERM when the benchmark dies, then exec'd on its arguments:
#: a benchmark stopped (Ctrl-C, kill) must not leave its trainers running, and training on into
#: the --keep-runs directory that a new invocation would then find taken. SIGTERM makes a trainer
#: finish its step and exit. (Not preexec_fn: the runs are started from threads.)
ORPHANLESS = [
    sys.executable,
    "-c",
    "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
]


def one_run(case: str, mixture: str, seed: int, args: argparse.Namespace) -> dict:
    run_dir = Path(args.work_dir) / f"{case}-{mixture}-seed{seed}"
    run_dir.mkdir(parents=True)
    (run_dir / "run.toml").write_text(tomli_w.dumps(run_config(case, mixture, seed, args)))
    cmd = [*ORPHANLESS, "-m", "andrea.daemon.trainer.service.cli", "--run-dir", str(run_dir)]
    if mixture in PAIRED:
        policy = run_dir.parent / f"policy-{case}-{mixture}.toml"
        policy.write_text(tomli_w.dumps(paired_policy(case, mixture)))
        cmd += ["--with-proxy", "--policy", str(policy)]
    elif mixture in REWARDS:
        cmd += ["--with-proxy", "--policy", str(Path(args.work_dir) / f"policy-{mixture}.toml")]
    elif mixture in TARGETED:
        policy = run_dir.parent / f"policy-{case}-{mixture}.toml"
        policy.write_text(tomli_w.dumps({"reward": mixture, "target": list(scored(case))}))
        cmd += ["--with-proxy", "--policy", str(policy)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{case} {mixture} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return score(run_dir, case, mixture, seed, seconds, args.steps)


def score(run_dir: Path, case: str, mixture: str, seed: int, seconds: float, steps: int) -> dict:
    """What a finished run measured, from its .eval.json and .loss.json."""
    evals = canonical_evals(read_evals(run_dir / ".eval.json"))
    (final,) = [e for e in evals if e.step == steps]
    curve = canonical_curve(read_entries(run_dir / ".loss.json"))
    arms = [e.arm for e in curve]
    second = arms[len(arms) // 2 :]
    held = {n: a.loss for n, a in final.arms.items()}
    names = sorted(set(arms) | set(held))
    return {
        "case": case,
        "mixture": mixture,
        "seed": seed,
        "seconds": seconds,
        "steps": len(arms),
        "heldout": held,
        "mean": statistics.fmean(held[n] for n in scored(case)),
        "share": {n: arms.count(n) / len(arms) for n in sorted(set(arms))},
        "share_second_half": {n: second.count(n) / len(second) for n in sorted(set(arms))},
        "window_shares": {
            n: [arms[i : i + WINDOW].count(n) / WINDOW for i in range(0, len(arms), WINDOW)]
            for n in names
        },
        "mean_all": statistics.fmean(held.values()),
        "order": order(arms),
        "heldout_by_step": {e.step: {n: a.loss for n, a in e.arms.items()} for e in evals},
        "plateau": plateau_detection(case, [(e.arm, e.loss) for e in curve], len(names)),
        "rising": rising_shares(arms, {e.step: e for e in evals}),
    }


#: The steps listed, of a run's departures from its paired uniform run (all are counted).
DEPARTURES_LISTED = 8
#: A run's order: each step's arm as one character, its index among the run's arms.
ORDER_CODE = "0123456789abcdefghijklmnopqrstuvwxyz"


def order(arms: list[str]) -> dict:
    """A run's arm of every step, compactly: the arms' names (sorted) and one character a step, the
    arm's index among them (a digit, then a letter)."""
    names = sorted(set(arms))
    if len(names) > len(ORDER_CODE):
        raise ValueError(f"{len(names)} arms: the order records at most {len(ORDER_CODE)}")
    index = {n: ORDER_CODE[i] for i, n in enumerate(names)}
    return {"names": names, "steps": "".join(index[a] for a in arms)}


def arms_of(run: dict) -> list[str] | None:
    """The arm of every step of a run, from its `order` (None for a run recorded without it)."""
    recorded = run.get("order")
    if recorded is None:
        return None
    return [recorded["names"][ORDER_CODE.index(c)] for c in recorded["steps"]]


def departures(run: dict, paired: dict) -> dict | None:
    """The steps at which `run` trained another arm than `paired` (the uniform run drawn from the
    same per-step uniforms): how many, and the first DEPARTURES_LISTED (None when either run was
    recorded without its order). Where a bandit mixes uniformly the two runs train the very same
    steps, so these are where the bandit's decisions, and nothing else, moved the run."""
    mine, theirs = arms_of(run), arms_of(paired)
    if mine is None or theirs is None:
        return None
    steps = [s for s, (a, b) in enumerate(zip(mine, theirs), start=1) if a != b]
    return {"count": len(steps), "first": steps[:DEPARTURES_LISTED]}


def rising_shares(arms: list[str], evals: dict) -> dict[str, float | None]:
    """Per arm, the least share of the steps it had over any 300-step stretch between two
    evaluations across which its held-out loss rose (None: it never rose over 300 steps)."""
    out: dict[str, float | None] = {}
    for name in sorted({n for e in evals.values() for n in e.arms}):
        shares = [
            arms[s : s + RISE].count(name) / RISE
            for s in sorted(evals)
            if s + RISE in evals and evals[s + RISE].arms[name].loss > evals[s].arms[name].loss
        ]
        out[name] = min(shares) if shares else None
    return out


def smoothed(own: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """An arm's (step, training loss) pairs, each loss replaced by the mean of its last SMOOTH."""
    return [
        (s, statistics.fmean(x for _, x in own[max(0, j - SMOOTH + 1) : j + 1]))
        for j, (s, _) in enumerate(own)
    ]


def plateau_detection(case: str, curve: list[tuple[str, float]], k: int) -> dict | None:
    """For a plateau case, the extra arm's plateau and how long the bandit took to see it. The
    arm's training loss is smoothed over its last 10 steps; its plateau is the first step at which
    that comes within 2% of its final value ("final") or of its lowest ("floor": an arm starved
    late is forgotten, and its final loss then says so rather than where learning it stopped), or
    98% of the way from its first value to its final one ("fall98", issue #49's).
    Detected: the first step from the plateau at which its share of the last 100 steps is below
    half of 1/K; steps_to_detect is the difference (None: never in the run)."""
    extra = EXTRA[case]
    own = [(s, loss) for s, (arm, loss) in enumerate(curve, start=1) if arm == extra]
    if case not in PLATEAU or not own:  # not a plateau case, or the arm left out
        return None
    smooth = smoothed(own)
    arms = [arm for arm, _ in curve]
    out: dict = {}
    first, final = smooth[0][1], smooth[-1][1]
    levels = (
        ("final", final * (1 + PLATEAU_MARGIN)),
        ("floor", min(m for _, m in smooth) * (1 + PLATEAU_MARGIN)),
        # Issue #49's definition, bench_exposure.py's --plateau-fall 0.98.
        ("fall98", first - PLATEAU_FALL * (first - final)),
    )
    for name, level in levels:
        plateau = next(s for s, m in smooth if m <= level)
        detected = next(
            (
                s
                for s in range(max(plateau, WINDOW), len(arms) + 1)
                if arms[s - WINDOW : s].count(extra) / WINDOW < 0.5 / k
            ),
            None,
        )
        out[name] = {
            "loss": level if name == "fall98" else level / (1 + PLATEAU_MARGIN),
            "plateau_step": plateau,
            "detected_step": detected,
            "steps_to_detect": None if detected is None else detected - plateau,
        }
    return out


def bandit_cost(reward: str, steps: int = 20000) -> float:
    """Microseconds per step of the proxy's bandit work (record one loss, assign one step), through
    the assignment book as the proxy does it; under the transfer reward with the probe its records
    carry every few steps."""
    arms = [ConfiguredArm(n, n, True) for n in (*LEARNABLE, "random")]
    extra = {"target": list(LEARNABLE)} if reward in TARGETED else {}
    book = AssignmentBook(Bandit(arms, Policy(reward=reward, **extra), seed=1), arms)
    lag, assigned = book.lag, {}
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        if s > lag:
            j = s - lag
            probe = {n: 3.0 - j * 1e-4 + (j % 5) / 100 for n in LEARNABLE}
            asked = book.bandit.probe_arms(j) is not None
            book.record(j, assigned[j], 2.0 + (s % 7) / 10, 0, None, probe if asked else None)
        assigned[s] = book.assign(s)
    return 1e6 * (time.perf_counter() - t0) / steps


def plan(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    jobs = []
    for seed in args.seeds:
        for case in args.cases:
            mixtures = [
                m
                for m in args.mixtures
                if not (case == "a" and "learnable" in m)
                and (m in (*TARGETED, "uniform-paired", *GRID) if case == "s" else m not in GRID)
            ]
            k = seed % len(mixtures)  # interleaved, so that a change of load touches all alike
            jobs += [(case, m, seed) for m in mixtures[k:] + mixtures[:k]]
    return jobs


def summarise(runs: list[dict]) -> dict:
    out: dict = {}
    for case in sorted({r["case"] for r in runs}):
        rs = [r for r in runs if r["case"] == case]
        by = {m: {r["seed"]: r for r in rs if r["mixture"] == m} for m in MIXTURES}
        if case == "a":
            by["uniform-learnable"] = by["uniform"]
            by["uniform-learnable-paired"] = by["uniform-paired"]
        elif case != "s" and not by["uniform-learnable-paired"]:
            # Case a's uniform-paired run draws the very steps of any case's
            # uniform-learnable-paired run.
            by["uniform-learnable-paired"] = {
                r["seed"]: r for r in runs if r["case"] == "a" and r["mixture"] == "uniform-paired"
            }
        by = {m: v for m, v in by.items() if v}
        extra = EXTRA[case]
        learnable = [*scored(case), *([LARGE] if case == "s" else [])]
        mixtures = {}
        for m, seeds in by.items():
            means = [r["mean"] for r in seeds.values()]
            mixtures[m] = {
                "mean": statistics.fmean(means),
                "sd": statistics.stdev(means) if len(means) > 1 else 0.0,
                "per_seed": {s: r["mean"] for s, r in sorted(seeds.items())},
                "share_second_half": {
                    n: statistics.fmean(r["share_second_half"].get(n, 0.0) for r in seeds.values())
                    for n in [*learnable, *([extra] if extra else [])]
                },
                "per_arm": {
                    n: statistics.fmean(r["heldout"][n] for r in seeds.values()) for n in learnable
                },
                "seconds": statistics.fmean(r["seconds"] for r in seeds.values()),
                # Runs reused from a mixing.json written before these were recorded lack them.
                "mean_all": statistics.fmean(r["mean_all"] for r in seeds.values())
                if all("mean_all" in r for r in seeds.values())
                else None,
                "steps_to_detect": {
                    s: (
                        r["plateau"]["final"]["steps_to_detect"],
                        r["plateau"]["floor"]["steps_to_detect"],
                    )
                    for s, r in sorted(seeds.items())
                    if r.get("plateau") is not None
                },
                "departures": {
                    x: found
                    for x, r in sorted(seeds.items())
                    if m not in (*PAIRED, *FIXED)
                    and x in by.get("uniform-paired", {})
                    and (found := departures(r, by["uniform-paired"][x])) is not None
                },
                "rising_min_share": {
                    s: min(
                        (r["rising"][n] for n in learnable if r["rising"][n] is not None),
                        default=None,
                    )
                    for s, r in sorted(seeds.items())
                    if "rising" in r
                },
            }
        out[case] = {
            "extra": extra,
            "mixtures": mixtures,
            "checks": checks(case, mixtures),
            "target_checks": {
                m: found for m in TARGETED if (found := target_checks(case, mixtures, m))
            },
        }
    return out


def paired_differences(a: dict, b: dict) -> dict | None:
    """a − b seed by seed over the seeds both have: the mean, its standard error (None with one
    seed) and the seeds."""
    seeds = sorted(set(a["per_seed"]) & set(b["per_seed"]))
    if not seeds:
        return None
    d = [a["per_seed"][x] - b["per_seed"][x] for x in seeds]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None
    return {"mean": statistics.fmean(d), "se": se, "seeds": seeds, "per_seed": d}


def target_checks(case: str, mx: dict, reward: str) -> dict:
    """The with-a-target figures of docs/mixing-quality.md: the gap recovered against the paired
    uniform mixtures (cases b to e), or, in case s, the transfer against uniform, target-only
    and the best mixture of the grid, seed by seed (paired: the same per-step uniforms)."""
    new = mx.get(reward)
    if new is None:
        return {}
    out: dict = {}
    uni, ref = mx.get("uniform-paired"), mx.get("uniform-learnable-paired")
    if case == "s":
        for m in ("uniform-paired", *GRID):
            if m in mx:
                out[f"minus_{m}"] = paired_differences(new, mx[m])
        grid = {m: mx[m]["mean"] for m in GRID if m in mx}
        if grid:
            best = min(grid, key=grid.__getitem__)
            out["best_grid"] = best
            out["minus_best_grid"] = paired_differences(new, mx[best])
        return out
    if uni is not None:
        out["minus_uniform_paired"] = paired_differences(new, uni)
    if uni is not None and ref is not None:
        seeds = sorted(set(new["per_seed"]) & set(uni["per_seed"]) & set(ref["per_seed"]))
        gaps = [uni["per_seed"][x] - ref["per_seed"][x] for x in seeds]
        won = [uni["per_seed"][x] - new["per_seed"][x] for x in seeds]
        if seeds and statistics.fmean(gaps):
            out["gap_recovered"] = statistics.fmean(won) / statistics.fmean(gaps)
            out["gap_recovered_per_seed"] = {
                x: w / g if g else None for x, w, g in zip(seeds, won, gaps)
            }
    return out


def checks(case: str, mx: dict) -> dict:
    """The done-when figures of docs/mixing-quality.md, where the runs to compute them exist: the
    new reward against each pair of uniform baselines (the paired ones, drawn from the bandit's
    uniforms, and the fixed ones, from the trainer's)."""
    new = mx.get(NEW)
    if new is None:
        return {}
    out: dict = {}
    extra = EXTRA[case]
    if extra is not None:
        out["extra_share_second_half"] = new["share_second_half"][extra]
    uni = mx.get("uniform-paired")
    if case in USELESS and uni is not None and None not in (new["mean_all"], uni["mean_all"]):
        out["all_minus_uniform_paired"] = new["mean_all"] - uni["mean_all"]
    for all_arms, learnable, tag in (
        ("uniform-paired", "uniform-learnable-paired", "paired"),
        ("uniform", "uniform-learnable", "fixed"),
    ):
        uni = mx.get(all_arms)
        if uni is None:
            continue
        out[f"minus_uniform_{tag}"] = new["mean"] - uni["mean"]
        paired = paired_differences(new, uni)
        if paired is not None and paired["se"] is not None:
            out[f"se_uniform_{tag}"] = paired["se"]
        ref = mx.get(learnable)
        if extra is not None and ref is not None:
            gap = uni["mean"] - ref["mean"]
            out[f"gap_recovered_{tag}"] = (uni["mean"] - new["mean"]) / gap if gap else None
    return out


def markdown(summary: dict, args: argparse.Namespace) -> str:
    lines = [
        f"andrea-tiny, {args.batch_size} sequences per step, {args.steps} steps (LR decay over "
        "the run), seeds "
        f"{' '.join(map(str, args.seeds))}; held-out loss (nats/token) at step {args.steps}, mean "
        f"over {', '.join(LEARNABLE)} (case s: {SMALL}) ({args.eval_sequences} sequences each).",
    ]
    for case, s in summary.items():
        extra = s["extra"]
        lines += ["", f"### Case {case}" + (f" (+ {extra})" if extra else ""), ""]
        seeds = sorted({seed for m in s["mixtures"].values() for seed in m["per_seed"]})
        head = "| mixture | mean ± sd | " + " | ".join(f"seed {x}" for x in seeds)
        head += " | second-half share " + (f"of {extra}" if extra else "(code/comments/docstrings)")
        lines += [head + " |", "|---" * (3 + len(seeds)) + "|"]
        uni = s["mixtures"].get("uniform-paired")
        notes: list[str] = []
        for m, v in s["mixtures"].items():
            if case == "a" and "learnable" in m:
                continue
            cells = []
            for x in seeds:
                value = v["per_seed"].get(x)
                if value is None:
                    cells.append("—")
                elif uni is not None and m != "uniform-paired" and x in uni["per_seed"]:
                    cells.append(f"{value:.4f} ({value - uni['per_seed'][x]:+.4f})")
                else:
                    cells.append(f"{value:.4f}")
            if v["steps_to_detect"]:
                detect = ", ".join(
                    f"seed {x}: {said_steps(final)} / {said_steps(floor)}"
                    for x, (final, floor) in v["steps_to_detect"].items()
                )
                notes.append(
                    f"{m}: steps from {extra}'s plateau (within 2% of its final / its lowest "
                    f"training loss) to its detection: {detect}"
                )
            if v.get("departures"):
                notes.append(
                    f"{m}: steps trained on another arm than uniform-paired of the same seed: "
                    + ", ".join(
                        f"seed {x}: {said_departures(d)}" for x, d in v["departures"].items()
                    )
                )
            rising = {x: r for x, r in v["rising_min_share"].items() if r is not None}
            if rising:
                notes.append(
                    f"{m}: least share of an arm over a {RISE}-step stretch across which its "
                    "held-out loss rose: "
                    + ", ".join(f"seed {x}: {r:.2f}" for x, r in rising.items())
                )
            share = v["share_second_half"]
            shown = (
                f"{share[extra]:.3f}" if extra else " / ".join(f"{share[n]:.2f}" for n in LEARNABLE)
            )
            lines.append(
                f"| {m} | {v['mean']:.4f} ± {v['sd']:.4f} | " + " | ".join(cells) + f" | {shown} |"
            )
        if s["checks"]:
            lines += ["", "Checks: " + "; ".join(said_checks(s["checks"], extra)) + "."]
        for reward, found in s.get("target_checks", {}).items():
            lines += ["", f"With a target ({reward}): " + "; ".join(said_target(found)) + "."]
        if notes:
            lines += ["", *(f"- {n}" for n in notes)]
    lines += [
        "",
        "Per seed, in parentheses: the difference to uniform-paired (uniform over all arms, drawn "
        "from the same per-step uniforms as the bandit) of the same seed.",
    ]
    return "\n".join(lines) + "\n"


def said_target(found: dict) -> list[str]:
    """target_checks' figures in words: each paired difference as its mean ± standard error and
    seed by seed, the gap recovered as a percentage."""
    said = []
    for key, v in found.items():
        if key.startswith("minus_") and v is not None:
            se = "" if v["se"] is None else f" ± {v['se']:.4f}"
            seeds = ", ".join(f"{d:+.4f}" for d in v["per_seed"])
            said.append(f"− {key.removeprefix('minus_')}: {v['mean']:+.4f}{se} ({seeds})")
        elif key == "best_grid":
            said.append(f"the best mixture of the grid: {v}")
        elif key == "gap_recovered":
            said.append(f"gap recovered: {v:.0%}")
    return said


def said_departures(d: dict) -> str:
    """A run's departures from its paired run: their count, and the first steps."""
    if not d["count"]:
        return "none"
    more = ", …" if d["count"] > len(d["first"]) else ""
    return f"{d['count']} ({', '.join(map(str, d['first']))}{more})"


def said_steps(d: int | None) -> str:
    """A count of steps, or "never" for a plateau the run never saw."""
    return "never" if d is None else str(d)


def said_checks(c: dict, extra: str | None) -> list[str]:
    said = []
    for tag in ("paired", "fixed"):
        if f"minus_uniform_{tag}" in c:
            se = c.get(f"se_uniform_{tag}")
            spread = (
                "" if se is None else f" ± {se:.4f} (standard error of the per-seed differences)"
            )
            said.append(f"{NEW} − uniform ({tag}): {c[f'minus_uniform_{tag}']:+.4f}{spread} nats")
        if c.get(f"gap_recovered_{tag}") is not None:
            said.append(
                f"gap between uniform over all and over the learnable arms ({tag}) recovered: "
                f"{100 * c[f'gap_recovered_{tag}']:.0f}%"
            )
    if "all_minus_uniform_paired" in c:
        said.append(
            f"{NEW} − uniform (paired), mean over all arms: "
            f"{c['all_minus_uniform_paired']:+.4f} nats"
        )
    if "extra_share_second_half" in c:
        said.append(f"{extra}'s second-half share: {c['extra_share_second_half']:.3f}")
    return said


def reusable(args: argparse.Namespace, ran: set[tuple[str, str, int]]) -> list[dict]:
    """The runs of `--reuse` that this invocation did not make, for the same steps and batch."""
    if args.reuse is None:
        return []
    old = json.loads(args.reuse.read_text())
    for key in ("steps", "batch_size"):
        # Runs of the earlier benchmark's default batch (8) recorded no batch size.
        was, now = int(old["args"].get(key, 8)), getattr(args, key)
        if was != now:
            raise SystemExit(f"--reuse {args.reuse}: {key} {was}, not {now}")
    # Runs recorded before the setting existed cut fixed windows (a new run's default then).
    was_windows = old["args"].get("windows", "fixed")
    if was_windows != args.windows:
        raise SystemExit(f"--reuse {args.reuse}: windows {was_windows}, not {args.windows}")
    was_small = old["args"].get("small_package", "asyncio")
    if "s" in args.cases and was_small != args.small_package:
        raise SystemExit(
            f"--reuse {args.reuse}: small package {was_small}, not {args.small_package}"
        )
    return [
        r
        for r in old["runs"]
        if (r["case"], r["mixture"], r["seed"]) not in ran
        and r["case"] in args.cases
        and r["seed"] in args.seeds
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="sequences per step (32: 2,048 tokens, as a step of andrea-12m)",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    p.add_argument("--cases", nargs="+", choices=sorted(EXTRA), default=sorted(EXTRA))
    p.add_argument("--mixtures", nargs="+", choices=MIXTURES, default=list(MIXTURES))
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    p.add_argument(
        "--small-package",
        default=SMALL_PACKAGE,
        help="case s: the standard-library package (or module, without .py) whose code is the "
        "small target arm",
    )
    p.add_argument(
        "--windows",
        choices=("shifted", "fixed"),
        default="shifted",
        help='[data] windows of every run: "shifted" (a new run\'s default), "fixed" (as the '
        "figures measured before 2026-12-07's afternoon were)",
    )
    p.add_argument("--eval-sequences", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path(os.environ.get("TMPDIR", "/tmp")) / "andrea-bench-mixing",
    )
    p.add_argument("--reuse", type=Path, help="an earlier mixing.json whose other runs to keep")
    p.add_argument(
        "--keep-runs",
        type=Path,
        help="an empty or new directory to train the runs in and keep them (default: a temporary one)",
    )
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    jobs = plan(args)
    # Before any run: a --reuse of other steps or batches is refused at once, not an hour later.
    reused = reusable(args, set(jobs))
    cost = {r: bandit_cost(r) for r in (*REWARDS, *TARGETED)}
    print(
        "bandit cost per step: " + ", ".join(f"{r} {us:.0f} µs" for r, us in cost.items()),
        flush=True,
    )
    runs: list[dict] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="andrea-mixing-") as temporary:
        work = str(args.keep_runs or temporary)
        Path(work).mkdir(parents=True, exist_ok=True)
        args.work_dir = work
        write_inputs(Path(work), args.small_package)

        def go(job: tuple[str, str, int]) -> dict:
            run = one_run(*job, args)
            print(
                f"[{time.perf_counter() - t0:6.0f} s] case {run['case']} {run['mixture']:17s} seed "
                f"{run['seed']}: mean {run['mean']:.4f} ({run['seconds']:.0f} s, second-half shares "
                f"{ {n: round(v, 3) for n, v in run['share_second_half'].items()} })",
                flush=True,
            )
            return run

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(go, jobs))
    summary = summarise(runs + reused)
    doc = {
        "args": {k: str(v) for k, v in vars(args).items() if k != "work_dir"},
        "seconds": time.perf_counter() - t0,
        "bandit_us_per_step": cost,
        "summary": summary,
        "runs": runs + reused,
        "reused": [[r["case"], r["mixture"], r["seed"]] for r in reused],
    }
    write_results(args.out_dir, "mixing", doc, markdown(summary, args))


def write_results(out_dir: Path, name: str, doc: dict, text: str) -> None:
    """NAME.json and NAME.md in `out_dir`; the markdown printed, with the time taken."""
    (out_dir / f"{name}.json").write_text(json.dumps(doc, indent=1))
    (out_dir / f"{name}.md").write_text(text)
    print(text)
    print(f"total {doc['seconds']:.0f} s; results in {out_dir}")


if __name__ == "__main__":
    main()
