"""The mixing benchmark's scoring (tests/bench/bench_mixing.py), on curves made by hand: when an
arm's plateau starts and when the bandit is found to have seen it, the least share of an arm while
its held-out loss rose, the steps a bandit's run trains otherwise than its paired uniform run, the
generated arms' bytes (the access log's lines parsed), and case s's target checks in words.
docs/mixing-quality.md's figures rest on these."""

from __future__ import annotations

import collections
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support.scripts import load_script

bench = load_script("bench_mixing", "tests/bench")


def test_plateau_and_its_detection_by_hand() -> None:
    # Four arms; the extra one ("letters") on every other step for 300 steps, its loss halving
    # towards 1.0 every step of its own, then the others only.
    curve = []
    for s in range(1, 601):
        if s <= 300 and s % 2 == 0:
            n = s // 2
            curve.append(("letters", 1.0 + 2.0 * 0.5**n))
        else:
            curve.append(("code", 3.0))
    out = bench.plateau_detection("d", curve, 4)
    # Its own losses are 1 + 2 / 2^n; its plateau is the step of its first loss at which the mean
    # of its last 10 is within 2% of the last such mean (also its lowest: it never rises).
    own = [1.0 + 2.0 * 0.5**n for n in range(1, 151)]
    smooth = [sum(own[max(0, j - 9) : j + 1]) / len(own[max(0, j - 9) : j + 1]) for j in range(150)]
    first = next(j for j, m in enumerate(smooth) if m <= smooth[-1] * 1.02)
    plateau = 2 * (first + 1)
    assert out["final"]["plateau_step"] == out["floor"]["plateau_step"] == plateau
    # 98% of the way from its first smoothed loss to its last (issue #49's plateau).
    level = smooth[0] - 0.98 * (smooth[0] - smooth[-1])
    assert out["fall98"]["plateau_step"] == 2 * (
        next(j for j, m in enumerate(smooth) if m <= level) + 1
    )
    # Half of 1/K is 12.5 of 100 steps: its share of steps s-99..s first falls below that once
    # fewer than 13 of them are its (it stops at step 300: at step 300 + 76, 12 of the last 100).
    detected = next(
        s for s in range(max(plateau, 100), 601)
        if sum(1 for a, _ in curve[s - 100 : s] if a == "letters") < 12.5
    )  # fmt: skip
    assert detected == 376
    assert out["final"]["steps_to_detect"] == detected - plateau
    assert bench.plateau_detection("a", curve, 4) is None


def test_a_forgotten_arm_makes_the_final_plateau_earlier_than_the_floor() -> None:
    # Learnt to 1.0 by its 20th step, then its last losses rise to 1.5: within 2% of 1.5 is
    # reached on the way down, long before it is within 2% of its lowest.
    own = [1.0 + 3.0 * math.exp(-n / 3) for n in range(1, 41)] + [1.5] * 10
    curve = [("letters" if s % 2 == 0 else "code", 0.0) for s in range(1, 101)]
    losses = iter(own)
    curve = [(a, next(losses) if a == "letters" else 3.0) for a, _ in curve]
    out = bench.plateau_detection("d", curve, 4)
    assert out["final"]["plateau_step"] < out["floor"]["plateau_step"]


def test_rising_shares_by_hand() -> None:
    # Evaluations every 100 steps; "code" rises from 300 to 600 (2.0 -> 2.1) and nowhere else
    # over 300 steps, "docs" never rises.
    held = {
        100: {"code": 2.3, "docs": 3.0},
        200: {"code": 2.2, "docs": 2.9},
        300: {"code": 2.0, "docs": 2.8},
        400: {"code": 2.05, "docs": 2.7},
        500: {"code": 2.08, "docs": 2.6},
        600: {"code": 2.1, "docs": 2.5},
    }
    evals = {
        s: SimpleNamespace(arms={n: SimpleNamespace(loss=x) for n, x in v.items()})
        for s, v in held.items()
    }
    # Steps 301..600 (indices 300..599): code on one step in ten.
    arms = ["docs"] * 600
    for i in range(300, 600, 10):
        arms[i] = "code"
    out = bench.rising_shares(arms, evals)
    assert out == {"code": 30 / 300, "docs": None}


def test_the_generated_arms() -> None:
    letters = b"".join(bench.letters_text(i) for i in range(8))
    odds = {k: v / len(letters) for k, v in collections.Counter(letters).items()}
    assert set(odds) == set(b"etao")
    for letter, n in bench.LETTER_ODDS.items():
        assert abs(odds[letter[0]] - n / 256) < 0.01
    assert bench.letters_text(3) == bench.letters_text(3) != bench.letters_text(4)
    synth = bench.synth_text(0)
    assert len(synth) == 4096 and set(synth) <= set(bench.SYNTH_LETTERS)
    # One of its pair's two letters 9 times in 10: the pairs' most common successor accounts for
    # well over a third of each pair's continuations, far above 1/26.
    follow: dict[bytes, collections.Counter] = collections.defaultdict(collections.Counter)
    text = b"".join(bench.synth_text(i) for i in range(40))
    for i in range(2, len(text)):
        follow[text[i - 2 : i]][text[i]] += 1
    top = sum(c.most_common(1)[0][1] for c in follow.values()) / sum(
        sum(c.values()) for c in follow.values()
    )
    assert top > 0.4
    for name, (letters, _, _) in bench.CHAINS.items():
        chain = bench.chain_text(name, 1)
        assert chain == bench.chain_text(name, 1) != bench.chain_text(name, 2)
        assert len(chain) == 4096 and set(chain) <= set(letters)
    memo = bench.memo_text()
    assert memo[: bench.MEMO_SIZE] == memo[bench.MEMO_SIZE : 2 * bench.MEMO_SIZE]


def test_the_generated_access_log() -> None:
    log = bench.logs_text(7)
    assert len(log) == 4096 and log == bench.logs_text(7) != bench.logs_text(8)
    # Every whole line parses, and its clock moves on by 0 to 6 seconds a line (across midnight too).
    pattern = re.compile(
        rb"2026-03-14T(\d\d):(\d\d):(\d\d)\.\d{3}Z worker-\d\d INFO GET (\S+)/\d+ "
        rb"(200|404|500) \d+ms"
    )
    lines = log.split(b"\n")[:-1]
    seconds = []
    for line in lines:
        m = pattern.fullmatch(line)
        assert m, line
        assert m[4].decode() in bench.LOG_PATHS
        seconds.append(3600 * int(m[1]) + 60 * int(m[2]) + int(m[3]))
    steps = [(b - a) % 86400 for a, b in zip(seconds, seconds[1:])]
    assert len(lines) > 40 and max(steps) <= 6 and len(set(steps)) == 7


def test_runs_reused_from_an_older_mixing_json_are_summarised() -> None:
    """`--reuse` takes runs recorded before the per-step shares, the plateau and the rising shares
    existed: the summary and its page leave those figures out instead of failing."""

    def old_run(mixture: str, seed: int, mean: float) -> dict:
        held = {"code": mean, "comments": mean, "docstrings": mean, "synth8": 2.0}
        share = {n: 0.25 for n in held}
        return {"case": "e", "mixture": mixture, "seed": seed, "seconds": 80.0, "steps": 1500,
                "heldout": held, "mean": mean, "share": share, "share_second_half": share}  # fmt: skip

    runs = [old_run(m, s, 2.2 + s / 100) for m in ("gated-learnability-2", "uniform-paired")
            for s in (1, 2)]  # fmt: skip
    summary = bench.summarise(runs)
    mixtures = summary["e"]["mixtures"]
    assert mixtures["gated-learnability-2"]["mean_all"] is None
    assert "all_minus_uniform_paired" not in summary["e"]["checks"]
    args = SimpleNamespace(batch_size=32, steps=1500, seeds=[1, 2], eval_sequences=128)
    page = bench.markdown(summary, args)
    assert "### Case e (+ synth8)" in page and "least share" not in page


def test_the_default_against_uniform_carries_the_standard_error_of_its_paired_differences() -> None:
    """docs/mixing-quality.md states the default against uniform as mean ± standard error of the
    per-seed differences: the page says the same as a hand computation."""

    def one(mixture: str, seed: int, mean: float) -> dict:
        held = {"code": mean, "comments": mean, "docstrings": mean, "synth8": 2.0}
        share = {n: 0.25 for n in held}
        return {"case": "e", "mixture": mixture, "seed": seed, "seconds": 80.0, "steps": 1500,
                "heldout": held, "mean": mean, "share": share, "share_second_half": share,
                "mean_all": mean}  # fmt: skip

    differences = {1: 0.010, 2: -0.030, 3: 0.050}
    runs = [one("uniform-paired", s, 2.0 + s / 10) for s in differences]
    runs += [one(bench.NEW, s, 2.0 + s / 10 + d) for s, d in differences.items()]
    checks = bench.summarise(runs)["e"]["checks"]
    # Differences 0.01, -0.03, 0.05: mean 0.01, sample standard deviation 0.04, over sqrt(3).
    assert checks["minus_uniform_paired"] == pytest.approx(0.01)
    assert checks["se_uniform_paired"] == pytest.approx(0.04 / math.sqrt(3))
    args = SimpleNamespace(batch_size=32, steps=1500, seeds=[1, 2, 3], eval_sequences=128)
    assert "+0.0100 ± 0.0231 (standard error" in bench.markdown(bench.summarise(runs), args)


def test_the_steps_a_bandit_run_trains_otherwise_than_its_paired_uniform_run() -> None:
    """docs/mixing-quality.md finds where a bandit's run departs from its paired uniform run (the
    same per-step uniforms): the steps counted and listed are those of a comparison by hand, a run
    recorded without its order is left out, and the page lists them."""
    uniform = ["code", "comments", "docstrings"] * 10
    moved = [2, 5, 6, 11, 13, 17, 19, 23, 29, 30]
    other = {"code": "comments", "comments": "docstrings", "docstrings": "code"}
    bandit = [other[a] if s in moved else a for s, a in enumerate(uniform, start=1)]
    assert bench.arms_of({"order": bench.order(bandit)}) == bandit

    def one(mixture: str, arms: list[str] | None) -> dict:
        held = {"code": 2.0, "comments": 2.0, "docstrings": 2.0}
        share = {n: 1 / 3 for n in held}
        run = {"case": "a", "mixture": mixture, "seed": 1, "seconds": 80.0, "steps": 30,
               "heldout": held, "mean": 2.0, "share": share, "share_second_half": share}  # fmt: skip
        return run if arms is None else {**run, "order": bench.order(arms)}

    summary = bench.summarise([one("uniform-paired", uniform), one(bench.NEW, bandit)])
    found = summary["a"]["mixtures"][bench.NEW]["departures"][1]
    assert found == {"count": 10, "first": moved[: bench.DEPARTURES_LISTED]}
    assert summary["a"]["mixtures"]["uniform-paired"]["departures"] == {}
    args = SimpleNamespace(batch_size=32, steps=30, seeds=[1], eval_sequences=128)
    assert "seed 1: 10 (2, 5, 6, 11, 13, 17, 19, 23, …)" in bench.markdown(summary, args)
    # Reused from a mixing.json written before the order was recorded: nothing to compare.
    older = bench.summarise([one("uniform-paired", None), one(bench.NEW, bandit)])
    assert older["a"]["mixtures"][bench.NEW]["departures"] == {}


def test_case_s_refuses_a_package_the_standard_library_lacks(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no-such-package: no such standard-library module"):
        bench.write_code_arms(tmp_path, "no-such-package")
    assert list(tmp_path.iterdir()) == []  # refused before any arm is written


def test_the_target_checks_in_words() -> None:
    new = {"per_seed": {1: 1.10, 2: 1.20}}
    best = {"per_seed": {1: 1.00, 2: 1.15}}
    found = {"best_grid": "grid-0.50", "minus_best_grid": bench.paired_differences(new, best)}
    said = bench.said_target(found)
    assert said[0] == "the best mixture of the grid: grid-0.50"
    # (0.10 + 0.05) / 2 = 0.075; the differences' standard deviation 0.0354 over √2 seeds: 0.025.
    assert said[1] == "− best_grid: +0.0750 ± 0.0250 (+0.1000, +0.0500)"
