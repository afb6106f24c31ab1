"""The held-out split: chosen by a hash of each document's identity, recorded in the data identity,
absent (and so unchanged) in runs created before it existed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import DataConfig, build_config, for_new_run
from andrea.daemon.data import heldout
from andrea.daemon.data.arms import ArmStream, load_arms


def _held(doc_id: str, fraction: float) -> bool:
    # The documented rule, written out independently of the code under test.
    h = hashlib.sha256(b"andrea.heldout.v1\0" + doc_id.encode()).digest()
    return int.from_bytes(h[:8], "big") < round(fraction * 2**64)


def _text_corpus(root: Path, n: int) -> dict[str, bytes]:
    docs = {}
    for i in range(n):
        rel = f"sub{i % 3}/doc{i:03d}.txt"
        data = (f"document {i} " * (40 + i)).encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        docs[rel] = data
    return docs


def _arm(tmp_path: Path, fraction: float | None):
    cfg = DataConfig.model_validate(
        {
            "arms": [{"name": "notes", "kind": "text", "paths": ["corpus/**/*.txt"]}],
            "cache_dir": str(tmp_path / "cache"),
            "heldout_fraction": fraction,
        }
    )
    (arm,) = load_arms(cfg, tmp_path, 256)
    return arm


def test_runs_without_a_split_keep_their_config_hash() -> None:
    # Hashes computed by the code before held-out splits and gradient accumulation existed: an
    # existing run.toml (no heldout_fraction, no grad_accum) must resume under the same hash.
    assert (
        build_config().trajectory_hash()
        == "9da9219e4f563267841399c3d70c439c7c662958748364d9efc7d9a3c2dd8a35"
    )
    assert (
        build_config({"preset": "andrea-12m", "batch_size": 4}).trajectory_hash()
        == "a241accf7ed8eb34a7516a93bdaac3689d43b12aaf09d2abef99527ed4e5c0ca"
    )
    assert build_config({"data": {"heldout_fraction": 0.0}}).trajectory_hash() == (
        build_config().trajectory_hash()
    )
    new = for_new_run(build_config())
    assert new.data.heldout_fraction == 0.05
    assert new.trajectory_hash() != build_config().trajectory_hash()
    assert (
        for_new_run(build_config({"data": {"heldout_fraction": 0.2}})).data.heldout_fraction == 0.2
    )


def test_text_arm_split_by_document_hash(tmp_path: Path) -> None:
    docs = _text_corpus(tmp_path / "corpus", 40)
    whole = _arm(tmp_path, None)
    # Unsplit: every document, in sorted path order, as before splits existed.
    assert whole.heldout is None
    assert bytes(whole.tokens) == b"\n\n".join(docs[k] for k in sorted(docs))

    arm = _arm(tmp_path, 0.3)
    held = [k for k in sorted(docs) if _held(k, 0.3)]
    kept = [k for k in sorted(docs) if not _held(k, 0.3)]
    assert held and kept
    assert bytes(arm.tokens) == b"\n\n".join(docs[k] for k in kept)
    assert bytes(arm.heldout) == b"\n\n".join(docs[k] for k in held)
    assert (arm.documents, arm.documents_held_out) == (40, len(held))
    # The split is part of the data identity; another fraction is another identity.
    assert arm.identity != whole.identity
    assert arm.identity != _arm(tmp_path, 0.31).identity
    # Cached: a second load reads the same split.
    assert bytes(_arm(tmp_path, 0.3).heldout) == bytes(arm.heldout)


def test_split_does_not_move_when_documents_are_added(tmp_path: Path) -> None:
    docs = _text_corpus(tmp_path / "corpus", 30)
    before = {k for k in docs if _held(k, 0.25)}
    (tmp_path / "corpus" / "sub0" / "zzz-new.txt").write_bytes(b"a new document " * 50)
    arm = _arm(tmp_path, 0.25)
    after_docs = {**docs, "sub0/zzz-new.txt": b"a new document " * 50}
    held_now = {k for k in after_docs if _held(k, 0.25)}
    assert before == held_now - {"sub0/zzz-new.txt"}
    assert bytes(arm.heldout) == b"\n\n".join(after_docs[k] for k in sorted(held_now))


def test_token_file_split_by_span(tmp_path: Path) -> None:
    n = 5 * heldout.TOKEN_SPAN + 1234
    tokens = (np.arange(n, dtype=np.int64) % 65000).astype("<u2")
    tokens.tofile(tmp_path / "web.u16")
    cfg = DataConfig.model_validate(
        {
            "arms": [{"name": "web", "kind": "tokens", "path": "web.u16", "dtype": "uint16"}],
            "cache_dir": str(tmp_path / "cache"),
            "heldout_fraction": 0.4,
        }
    )
    (arm,) = load_arms(cfg, tmp_path, 65536)
    spans = [tokens[i : i + heldout.TOKEN_SPAN] for i in range(0, n, heldout.TOKEN_SPAN)]
    held = [s for i, s in enumerate(spans) if _held(f"span:{i}", 0.4)]
    kept = [s for i, s in enumerate(spans) if not _held(f"span:{i}", 0.4)]
    assert held and kept
    want_train, want_held = np.concatenate(kept), np.concatenate(held)
    assert arm.n_tokens == len(want_train) and arm.heldout.shape[0] == len(want_held)
    idx = np.arange(arm.n_tokens)
    assert np.array_equal(arm.tokens[idx], want_train)
    assert np.array_equal(arm.heldout[np.arange(len(want_held))], want_held)
    # Training batches come from the kept spans only.
    batch = ArmStream(arm, seed=3, block_size=64).next_batch(16)
    assert set(np.unique(batch)) <= set(np.unique(want_train))


def test_eval_sequences_are_fixed_and_evenly_spread() -> None:
    starts = heldout.eval_starts(n_tokens=10_001, block_size=100, count=8)
    assert starts.tolist() == [0, 1200, 2500, 3700, 5000, 6200, 7500, 8700]
    assert heldout.eval_starts(n_tokens=350, block_size=100, count=8).tolist() == [0, 100, 200]
    assert heldout.eval_starts(n_tokens=100, block_size=100, count=8).tolist() == []


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_fraction_out_of_range_is_a_config_error(bad: float) -> None:
    from andrea.daemon.config import ConfigError

    with pytest.raises(ConfigError, match="heldout_fraction"):
        build_config({"data": {"heldout_fraction": bad}})
