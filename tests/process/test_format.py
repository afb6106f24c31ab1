"""The .bin payload read by a third party with numpy alone, per docs/checkpoint-format.md."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from andrea.daemon.checkpoint import format as ckpt_format
from tests.support.daemons import run_trainer


def numpy_only_reader(path: Path) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """Written from the format spec, independent of the project's own reader."""
    raw = path.read_bytes()
    step, n = np.frombuffer(raw[:8], dtype="<i4")
    flat = np.frombuffer(raw[8:], dtype="<f4")
    assert len(raw) == 8 + 12 * int(n)
    return int(step), int(n), flat[:n], flat[n : 2 * n], flat[2 * n :]


def test_third_party_reader(tmp_path: Path, cache_dir: Path) -> None:
    res = run_trainer(tmp_path, cache_dir, "--max-steps", "3", "--checkpoint-every", "0")
    assert res.returncode == 0, res.stderr
    path = tmp_path / "step_000003.bin"
    manifest = json.loads((tmp_path / "step_000003.json").read_text())
    step, n, w, m, v = numpy_only_reader(path)
    assert (step, n) == (3, 136_960) == (manifest["step"], manifest["n_params"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == manifest["bin_sha256"]
    assert manifest["optimizer"]["adam_step"] == 3

    # The layout tiles the flat array exactly, in order, with the documented first and last names.
    offset = 0
    for e in manifest["layout"]:
        assert e["offset"] == offset
        offset += int(np.prod(e["shape"]))
    assert offset == n
    assert (
        manifest["layout"][0]["name"] == "wte.weight"
        and manifest["layout"][-1]["name"] == "lm_head.weight"
    )
    # Adam's moments are real state after 3 updates: v is a non-negative EMA of squares, m is not zero.
    assert np.all(v >= 0) and np.any(v > 0) and np.any(m != 0)
    assert np.all(np.isfinite(w))
    # LayerNorm weights start at 1 and have moved after 3 updates.
    ln = next(e for e in manifest["layout"] if e["name"] == "ln_f.weight")
    ln_w = w[ln["offset"] : ln["offset"] + ln["shape"][0]]
    assert np.any(ln_w != 1.0) and np.allclose(ln_w, 1.0, atol=0.1)

    # The project's reader agrees with the independent one, bit for bit.
    p = ckpt_format.read_payload(path)
    assert (p.step, p.n_params) == (step, n)
    assert (
        p.weights.tobytes() == w.tobytes()
        and p.m.tobytes() == m.tobytes()
        and p.v.tobytes() == v.tobytes()
    )
    named = ckpt_format.unflatten(
        p.weights, [(e["name"], tuple(e["shape"]), e["offset"]) for e in manifest["layout"]]
    )
    assert named["wpe.weight"].shape == (64, 64)
