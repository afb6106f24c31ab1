"""Where each epoch cuts an arm into training sequences (`[data] windows`, daemon/data/arms.py):
shifted windows for new runs, the same fixed windows as before for runs created before."""

from __future__ import annotations

import numpy as np
import pytest

from andrea.daemon.config import ConfigError, build_config, with_windows
from andrea.daemon.data.arms import Arm, ArmStream

BLOCK = 16


def arm(n_tokens: int = 1_000, name: str = "a") -> Arm:
    # Random bytes: every window of 17 tokens is found at one place only.
    tokens = np.random.default_rng(0).integers(0, 256, n_tokens, dtype=np.uint8)
    return Arm(name, f"id-{name}", tokens)


def starts(stream: ArmStream, rows: np.ndarray) -> list[int]:
    """Where in the arm each drawn row begins, found by searching the arm's tokens."""
    tokens = np.asarray(stream.arm.tokens)
    out = []
    for row in rows:
        hits = [
            s for s in range(len(tokens) - BLOCK) if np.array_equal(tokens[s : s + BLOCK + 1], row)
        ]
        assert hits, "a row that is no window of the arm"
        out.append(hits[0])
    return out


def epochs(stream: ArmStream, count: int) -> list[list[int]]:
    return [sorted(starts(stream, stream.next_batch(stream.n_chunks))) for _ in range(count)]


def test_fixed_windows_are_cut_where_they_always_were() -> None:
    stream = ArmStream(arm(), seed=3, block_size=BLOCK)
    assert stream.n_chunks == (1_000 - 1) // BLOCK
    for cut in epochs(stream, 3):
        assert cut == [k * BLOCK for k in range(stream.n_chunks)]


def test_shifted_windows_move_from_epoch_to_epoch_and_stay_inside_the_arm() -> None:
    stream = ArmStream(arm(), seed=3, block_size=BLOCK, shifted=True)
    assert stream.n_chunks == (1_000 - BLOCK) // BLOCK
    cuts = epochs(stream, 12)
    offsets = {cut[0] for cut in cuts}
    for cut in cuts:
        # One epoch: every window once, block_size apart, from that epoch's offset.
        assert cut == [cut[0] + k * BLOCK for k in range(stream.n_chunks)]
        assert 0 <= cut[0] < BLOCK and cut[-1] + BLOCK + 1 <= 1_000
    assert len(offsets) >= 6  # 12 draws of 16 offsets: all alike would be a broken draw
    assert [c[0] for c in cuts] == [stream.shift(e) for e in range(12)]


def test_shifted_windows_are_a_function_of_seed_arm_and_epoch() -> None:
    one = ArmStream(arm(), seed=3, block_size=BLOCK, shifted=True)
    again = ArmStream(arm(), seed=3, block_size=BLOCK, shifted=True)
    assert np.array_equal(one.next_batch(200), again.next_batch(200))
    other_seed = ArmStream(arm(), seed=4, block_size=BLOCK, shifted=True)
    other_arm = ArmStream(arm(name="b"), seed=3, block_size=BLOCK, shifted=True)
    shifts = [one.shift(e) for e in range(20)]
    assert shifts != [other_seed.shift(e) for e in range(20)]
    assert shifts != [other_arm.shift(e) for e in range(20)]


def test_a_resumed_cursor_draws_what_the_uninterrupted_one_does() -> None:
    """Mid-epoch and across epochs: the cursor (epoch, position) is all a checkpoint keeps."""
    whole = ArmStream(arm(), seed=9, block_size=BLOCK, shifted=True)
    first = ArmStream(arm(), seed=9, block_size=BLOCK, shifted=True)
    expected = whole.next_batch(300)
    head = first.next_batch(137)
    resumed = ArmStream(arm(), seed=9, block_size=BLOCK, shifted=True)
    resumed.load_state_dict(first.state_dict())
    assert np.array_equal(np.concatenate([head, resumed.next_batch(163)]), expected)


def test_a_batch_gathered_elsewhere_from_its_ids_has_the_same_tokens() -> None:
    """The step loader draws ids on one thread and gathers their tokens on another."""
    stream = ArmStream(arm(), seed=1, block_size=BLOCK, shifted=True)
    twin = ArmStream(arm(), seed=1, block_size=BLOCK, shifted=True)
    ids = stream.next_chunks(150)  # crosses two epochs: 61 windows each
    assert np.array_equal(stream.tokens_of(ids), twin.next_batch(150))


def test_an_arm_of_under_two_windows_is_cut_as_before() -> None:
    small = ArmStream(arm(2 * BLOCK - 1), seed=1, block_size=BLOCK, shifted=True)
    assert not small.shifted and small.n_chunks == 1 and small.shift(5) == 0
    assert starts(small, small.next_batch(3)) == [0, 0, 0]


def test_a_new_run_gets_shifted_windows_and_an_existing_one_keeps_its_own() -> None:
    unset = build_config()
    assert unset.data.windows is None
    assert with_windows(unset, "shifted").data.windows == "shifted"
    # Created before the setting (its checkpoints record none): unset, and its data order with it.
    assert with_windows(unset, None).data.windows is None
    fixed = build_config({"data": {"windows": "fixed"}})
    assert with_windows(fixed, "shifted").data.windows == "fixed"
    # A run created before the setting hashes as it always did; fixed says the same.
    assert fixed.trajectory_hash() == unset.trajectory_hash()
    shifted = with_windows(unset, "shifted")
    assert shifted.trajectory_hash() != unset.trajectory_hash()


def test_an_unknown_windows_value_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="windows"):
        build_config({"data": {"windows": "random"}})
