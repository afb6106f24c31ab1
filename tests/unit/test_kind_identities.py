"""The identity of every arm kind over fixed files, pinned: moving the kinds into a registry
(daemon/data/kinds/) changed no identity, so no run's checkpoint or token cache goes stale.

The literals in IDENTITIES were computed by the code before the registry existed (commit 1f32aff,
daemon/data/arms.py's if-chains), by running this module's `identities` on it; they were not
computed by the code they now check. Each is the identity `arm_identity` gives (the proxy's) and
`load_arms` gives (the trainer's), for the byte-level tokenizer, without and with a held-out split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import DataConfig, build_config
from andrea.daemon.data import corpus
from andrea.daemon.data.arms import arm_identity, load_arms

#: The arms over the files `_write` makes. A parquet arm's identity hashes its files' bytes without
#: parsing them, so its "Parquet" file is fixed bytes (pyarrow writes its version into a file).
ARMS: list[dict[str, object]] = [
    {"name": "docs", "kind": "stdlib", "part": "docstrings"},
    {"name": "code", "kind": "stdlib", "part": "code"},
    {"name": "comments", "kind": "stdlib", "part": "comments"},
    {"name": "notes", "kind": "text", "paths": ["notes/**/*.txt"]},
    {"name": "web", "kind": "jsonl", "paths": ["web/*.jsonl"]},
    {"name": "web-body", "kind": "jsonl", "paths": ["web/*.jsonl"], "field": "body"},
    {"name": "hub", "kind": "parquet", "paths": ["hub/*.parquet"]},
    {"name": "hub-content", "kind": "parquet", "paths": ["hub/*.parquet"], "field": "content"},
    {"name": "ids", "kind": "tokens", "path": "tok/train.bin", "dtype": "uint16"},
    {
        "name": "ids-val",
        "kind": "tokens",
        "path": "tok/train.bin",
        "dtype": "uint16",
        "heldout_path": "tok/val.bin",
    },
]

#: Computed by the code before the registry (see the module's docstring), never by the code now.
#: The training config's hash of a run of the andrea-tiny preset over ARMS, computed alike.
TRAJECTORY_HASH = "bf619cd6d9a448d2d208ec45da35b3737558fca75a49281aa526a4aef695416b"
IDENTITIES: dict[str, dict[str, str]] = {
    "None": {
        "docs": "fb3fd5ab8d139edcf60cb0f9b53b590d6296878b926743903687f30e18aeabf0",
        "code": "8fe88c1a42647b435f4544f92de6c68c425f188b89f58b91eee20d38b80f76af",
        "comments": "889b7b5a84e677235b30fdc68ef9a401c7185500a0b80f2c1b1c5a75b051ea88",
        "notes": "1e8c983a871446ed94c9831d2fe998f349ec007232a4d5b68d2ecfb73f2e2ee3",
        "web": "71af02051c481d9d14156f8e834555c1aa1d9d1b26c153d2788c601fe071d01d",
        "web-body": "f1670fa205837aec229e4a01bf1318656a6f4571065e525a6d31299bdfd9e127",
        "hub": "74383b2249d8206d568888871577f2ae50678f7806c3a07cced70d3514d31778",
        "hub-content": "7f3ce34205e244e578a405c25adfe8031e25b3ce092117673d6de90c7cc349d4",
        "ids": "9cf7f1b5bba3c1e2a72f2a7151c8dcc790175ccda2556fcf25bc50a8c08c710d",
        "ids-val": "9cf7f1b5bba3c1e2a72f2a7151c8dcc790175ccda2556fcf25bc50a8c08c710d",
    },
    "0.25": {
        "docs": "0eed1c99e37eae82ea46ca8d409fe229455f677c7d19b422009b3bdc6b4871e5",
        "code": "d5866f58b1ffb614b2e501bb912e2c018475b86a062854f3e4c6a890f4453288",
        "comments": "525c95a76d196236a3ac8a75a43f5ff6b3939810f9b6fd2cb563fac81b2a0392",
        "notes": "6a6a6464da4602c1f71be6e47d99e709b0fbd2f70da04734ee08b40f01a8224c",
        "web": "22c6d02470eb31c4ccf8346ac458497a835af336ec3ffb7f2a988d87f3b152d5",
        "web-body": "ee21c8e3db5ee345d6c342149efe808669585936759b8289133cfc14d85ecaa2",
        "hub": "a359d6b155fec56bedb5aec8d8c3a0d5d31836bd469142a93a6081514736e91c",
        "hub-content": "0c0c801e9726a36a7b8f4962d2db4390b91faaa72e3e2ce7b7ae5d69344cf7ba",
        "ids": "b9935d1bce4992fef9a0eae211fb0c0f2d0efc3049d929141456ccffd8eb8ded",
        "ids-val": "e6eb5fe1fd948abc299a7b441c10b09bcc43e983d1229bfdff9fef06b92d14f9",
    },
}


def _write(root: Path) -> Path:
    """The fixed files under `root`; the directory a stdlib arm reads as the standard library."""
    stdlib = root / "stdlib"
    (stdlib / "pkg").mkdir(parents=True)
    (stdlib / "alpha.py").write_text('"""Alpha."""\n\n# a comment\nx = 1\n')
    (stdlib / "pkg" / "beta.py").write_text('def f():\n    """Beta\'s f."""\n    return 2  # two\n')
    (root / "notes" / "sub").mkdir(parents=True)
    (root / "notes" / "a.txt").write_text("the first note\n" * 20)
    (root / "notes" / "sub" / "b.txt").write_text("the second note, deeper\n" * 20)
    (root / "web").mkdir()
    lines = [f'{{"text": "line {i} of the web", "body": "body {i}"}}' for i in range(40)]
    (root / "web" / "a.jsonl").write_text("\n".join(lines[:20]) + "\n")
    (root / "web" / "b.jsonl").write_text("\n".join(lines[20:]) + "\n")
    (root / "hub").mkdir()
    (root / "hub" / "train-0.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 3 + b"PAR1")
    (root / "tok").mkdir()
    (np.arange(3000, dtype=np.uint16) % 200).tofile(root / "tok" / "train.bin")
    (np.arange(500, dtype=np.uint16) % 150).tofile(root / "tok" / "val.bin")
    return stdlib


def identities(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, str]]:
    """Each arm's identity by the proxy's path, for no held-out split and a quarter held out."""
    stdlib = _write(root)
    monkeypatch.setattr(corpus, "stdlib_root", lambda: stdlib)
    out: dict[str, dict[str, str]] = {}
    for fraction in (None, 0.25):
        data = DataConfig.model_validate(
            {"arms": ARMS, "cache_dir": str(root / "cache"), "heldout_fraction": fraction}
        )
        out[str(fraction)] = {s.name: arm_identity(s, data, root, 256) for s in data.arms}
    return out


def test_every_kinds_identity_is_the_one_the_code_before_the_registry_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert identities(tmp_path, monkeypatch) == IDENTITIES


def test_the_trainer_builds_the_same_identities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdlib = _write(tmp_path)
    monkeypatch.setattr(corpus, "stdlib_root", lambda: stdlib)
    # The "Parquet" file above is not one: the trainer reads it, so it gets its own arms here.
    arms = [a for a in ARMS if a["kind"] != "parquet"]
    data = DataConfig.model_validate(
        {"arms": arms, "cache_dir": str(tmp_path / "cache"), "heldout_fraction": 0.25}
    )
    built = {a.name: a.identity for a in load_arms(data, tmp_path, 256)}
    assert built == {name: IDENTITIES["0.25"][name] for name in built}


def test_the_config_hash_of_every_kind_is_the_one_before_the_registry() -> None:
    cfg = build_config({}, {"preset": "andrea-tiny", "data": {"arms": ARMS}})
    assert cfg.trajectory_hash() == TRAJECTORY_HASH
