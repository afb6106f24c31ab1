"""The model card of `andreactl export --format hf` (control/export/card.py): each arm's source as
configured, with a dtype only where the arm has one (a tokens file), and nothing left unset."""

from __future__ import annotations

from andrea.control.export.card import card_arms
from andrea.daemon.config import build_config
from andrea.daemon.data.arms import CursorState


def test_only_a_tokens_arm_shows_a_dtype() -> None:
    arms = [
        {"name": "notes", "kind": "text", "paths": ["notes/*.txt"]},
        {"name": "ids", "kind": "tokens", "path": "train.bin", "dtype": "uint16"},
        {"name": "code", "kind": "stdlib", "part": "code", "weight": 2.0},
    ]
    config = build_config({"data": {"arms": arms}}).model_dump(mode="json")
    cursors = [
        CursorState(name=a["name"], identity="0" * 64, n_tokens=10, n_chunks=1, epoch=0, position=0)
        for a in arms
    ]
    sources = {a["name"]: a["source"] for a in card_arms(config, cursors)}
    assert sources["notes"] == {"kind": "text", "paths": ["notes/*.txt"], "weight": 1.0}
    assert sources["ids"] == {
        "kind": "tokens",
        "path": "train.bin",
        "dtype": "uint16",
        "weight": 1.0,
    }
    assert sources["code"] == {"kind": "stdlib", "part": "code", "weight": 2.0}
