"""The exposure benchmark's arm sequences and plateau (tests/bench/bench_exposure.py), checked by
hand: what a cut variant trains up to its cut and after it, and where an arm's plateau is.
docs/mixing-quality.md's bounds on what seeing a plateau can buy rest on these."""

from __future__ import annotations

from tests.support.scripts import load_script

load_script("bench_mixing", "tests/bench")  # bench_exposure imports it by name
bench = load_script("bench_exposure", "tests/bench")

STDLIB = ["code", "comments", "docstrings"]


def test_a_cut_variant_is_the_uniform_run_up_to_its_cut_and_the_three_arms_after() -> None:
    uniform = bench.arm_sequence("uniform", 3, 600, "letters")
    for variant, late in (("cut-at-plateau", 0), ("cut-150", 150)):
        cut = bench.arm_sequence(variant, 3, 600, "letters", plateau=200)
        assert cut[: 200 + late] == uniform[: 200 + late]
        assert "letters" not in cut[200 + late :]
        # After the cut, each step is the three-arm draw of the same uniform: the arms in name
        # order, a third each (the base run's sequence).
        base = bench.arm_sequence("base", 3, 600)
        assert cut[200 + late :] == base[200 + late :]
    assert set(uniform) == {*STDLIB, "letters"}


def test_measured_drops_the_extra_arm_once_its_third_loss_is_known() -> None:
    seq = bench.arm_sequence("measured", 1, 400, "letters")
    steps = [s for s, a in enumerate(seq, start=1) if a == "letters"]
    third = steps[bench.MEASURED_PULLS - 1]
    assert steps[-1] <= third + bench.LAG
    assert (
        seq[: third + bench.LAG]
        == bench.arm_sequence("uniform", 1, 400, "letters")[: third + bench.LAG]
    )


def test_the_plateau_by_hand() -> None:
    # Its losses at steps 2, 4, 6, ...: 5.0, then halving towards 1.0 (1 + 4 / 2^n), then flat.
    losses = [(2 * n, 1.0 + 4.0 * 0.5 ** (n - 1)) for n in range(1, 61)]
    means = [
        sum(x for _, x in losses[max(0, j - 9) : j + 1]) / len(losses[max(0, j - 9) : j + 1])
        for j in range(60)
    ]
    final = means[-1]
    # Within 2% of the final mean of its last 10 losses...
    j = next(j for j, m in enumerate(means) if m <= final * 1.02)
    assert bench.plateau_step(losses) == losses[j][0]
    # ...or 98% of the way from its first loss (5.0) down to that mean.
    k = next(k for k, m in enumerate(means) if m <= final + 0.02 * (5.0 - final))
    assert bench.plateau_step(losses, 0.98) == losses[k][0]
    assert k < j  # 2% of the fall (0.08 nats here) is looser than 2% of 1.0, so it comes sooner
