"""The proxy identifies arms without building their data, and gets what the trainer gets."""

from __future__ import annotations

from pathlib import Path

from andrea.daemon.config import build_config
from andrea.daemon.data.arms import arm_identity, load_arms


def test_identities_without_building_match_the_built_arms(tmp_path: Path, cache_dir: Path) -> None:
    text = tmp_path / "notes"
    text.mkdir()
    (text / "a.txt").write_text("first file\n")
    (text / "b.txt").write_text("second file\n")
    cfg = build_config({}, {"preset": "andrea-tiny", "data": {"cache_dir": str(cache_dir)}})
    arms = [
        *cfg.data.arms,
        cfg.data.arms[0].model_copy(
            update={"name": "notes", "kind": "text", "part": None, "paths": ["notes/*.txt"]}
        ),
    ]
    data = cfg.data.model_copy(update={"arms": arms})
    built = {a.name: a.identity for a in load_arms(data, tmp_path, cfg.model.vocab_size)}
    assert {s.name: arm_identity(s, data, tmp_path, cfg.model.vocab_size) for s in arms} == built
    assert len(set(built.values())) == len(built)
    # With a held-out split the identity names the split, on both sides. Shown on the text arm: the
    # split's identity is the same code for every encoded kind (encoded_identity), and a split
    # stdlib arm would encode the whole stdlib again (seconds), for no other path.
    split = data.model_copy(update={"heldout_fraction": 0.5, "arms": arms[-1:]})
    built_split = {a.name: a.identity for a in load_arms(split, tmp_path, cfg.model.vocab_size)}
    assert {
        s.name: arm_identity(s, split, tmp_path, cfg.model.vocab_size) for s in split.arms
    } == built_split
    assert built_split["notes"] != built["notes"]
    # Without building, every arm's split identity differs from its unsplit one.
    for s in arms:
        apart = data.model_copy(update={"heldout_fraction": 0.5})
        whole_id = arm_identity(s, data, tmp_path, cfg.model.vocab_size)
        assert arm_identity(s, apart, tmp_path, cfg.model.vocab_size) != whole_id, s.name
