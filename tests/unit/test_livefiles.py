"""Token files read while the run lives (daemon/data/livefiles.py): the same ids as the memory map
they replace, and every change of the file under the run an error naming it, never a signal."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from andrea.daemon.config import DataConfig
from andrea.daemon.data import heldout
from andrea.daemon.data.arms import ArmStream, load_arms
from andrea.daemon.data.livefiles import DataWatch, TokenFile, TokensChanged

N = 3 * heldout.TOKEN_SPAN + 123


def _file(tmp_path: Path, dtype: str = "<u2", offset: int = 0) -> tuple[Path, np.ndarray]:
    ids = np.random.default_rng(0).integers(0, 256, N).astype(dtype)
    path = tmp_path / "mine.bin"
    path.write_bytes(b"\x07" * offset + ids.tobytes())
    return path, ids


def _arms(tmp_path: Path, fraction: float) -> DataConfig:
    return DataConfig.model_validate(
        {
            "arms": [{"name": "mine", "kind": "tokens", "path": "mine.bin", "dtype": "uint16"}],
            "cache_dir": str(tmp_path / "cache"),
            "heldout_fraction": fraction,
        }
    )


@pytest.mark.parametrize("dtype, offset", [("<u2", 0), ("<u4", 1024), ("u1", 0)])
def test_reads_are_the_maps_reads(tmp_path: Path, dtype: str, offset: int) -> None:
    """Whatever the opener mapped (a header's offset, any width): the same ids, in the shape of
    the index, for a batch's rows, a single run, and scattered indices."""
    path, ids = _file(tmp_path, dtype, offset)
    mapped = np.memmap(path, dtype=dtype, mode="r", offset=offset)
    f = TokenFile(mapped, "mine", None)
    assert f.shape == mapped.shape and f.dtype == mapped.dtype and len(f) == N
    rows = np.array([70_000, 5, 5, N - 65])[:, None] + np.arange(65)
    scattered = np.array([N - 1, 0, 17, 16, 18, 70_000])
    for index in (rows, np.arange(1000), scattered, np.array([], dtype=np.int64)):
        assert np.array_equal(f[index], mapped[index])
        assert f[index].dtype == mapped.dtype
    with pytest.raises(IndexError):
        f[np.array([N])]
    assert np.array_equal(np.asarray(f), ids) and np.array_equal(f[10:20:3], ids[10:20:3])
    assert int(f[7]) == int(ids[7])


def test_loaded_arms_read_through_it_and_draw_the_same_batches(tmp_path: Path) -> None:
    """A split arm's training and held-out spans are read by `pread`, with the same batches as
    through the map (the data order is part of the format)."""
    path, ids = _file(tmp_path)
    (arm,) = load_arms(_arms(tmp_path, 0.3), tmp_path, 256)
    assert isinstance(arm.tokens, heldout.Spliced) and isinstance(arm.tokens.base, TokenFile)
    assert isinstance(arm.heldout, heldout.Spliced) and isinstance(arm.heldout.base, TokenFile)
    kept, _ = heldout.split_token_spans(N, 0.3)
    mapped = heldout.Spliced(np.memmap(path, dtype="<u2", mode="r"), kept)
    ours, theirs = ArmStream(arm, 7, 64), ArmStream(arm, 7, 64)
    theirs.arm = type(arm)(arm.name, arm.identity, mapped)
    for _ in range(5):
        assert np.array_equal(ours.next_batch(8), theirs.next_batch(8))
    assert DataWatch([arm]).changed() is None


def _watched(tmp_path: Path) -> tuple[Path, TokenFile, DataWatch]:
    path, _ = _file(tmp_path)
    (arm,) = load_arms(_arms(tmp_path, 0.0), tmp_path, 256)
    assert isinstance(arm.tokens, TokenFile)
    return path, arm.tokens, DataWatch([arm])


def test_a_truncated_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path, f, watch = _watched(tmp_path)
    os.truncate(path, 1000)
    said = watch.changed()
    assert said == (
        f"arm 'mine': token file {path} changed under the run: "
        f"{2 * N:,} bytes when the run opened it, 1,000 now"
    )
    with pytest.raises(TokensChanged, match="1,000 now"):
        f[np.arange(600, 700)]


def test_an_in_place_rewrite_is_found_by_its_time_and_by_its_ids(tmp_path: Path) -> None:
    path, f, watch = _watched(tmp_path)
    st = path.stat()
    with path.open("r+b") as out:
        out.write(np.full(N, 300, dtype="<u2").tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert "rewritten in place (its modification time changed)" in (watch.changed() or "")
    with pytest.raises(TokensChanged, match="rewritten in place"):
        f[np.arange(10)]
    # The modification time put back: the stat cannot see it, the ids read can.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert watch.changed() is None
    with pytest.raises(TokensChanged, match="holds id 300, not below .* vocab_size 256"):
        f[np.arange(10)]


def test_a_replaced_or_removed_file_is_a_change(tmp_path: Path) -> None:
    path, f, watch = _watched(tmp_path)
    before = f[np.arange(100)]
    other = tmp_path / "new.bin"
    other.write_bytes(path.read_bytes())
    other.replace(path)
    assert "replaced by another file" in (watch.changed() or "")
    assert np.array_equal(f[np.arange(100)], before)  # the open file is still the one opened
    path.unlink()
    assert "changed under the run: removed" in (watch.changed() or "")


def test_the_caches_paths_are_not_watched_its_open_files_are(tmp_path: Path) -> None:
    """The cache replaces an entry only by one of the same content and removes one only to
    encode it again: the run goes on reading the files it opened. Those changed in place stop it."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("alpha beta gamma\n" * 500)
    cfg = DataConfig.model_validate(
        {
            "arms": [{"name": "notes", "kind": "text", "paths": ["notes/*.txt"]}],
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    (arm,) = load_arms(cfg, tmp_path, 256)
    assert isinstance(arm.tokens, TokenFile)
    watch, cached = DataWatch([arm]), arm.tokens.path
    opened = cached.with_name("opened")
    os.link(cached, opened)  # another name of the file the run has open
    copy = cached.with_name("copy")
    copy.write_bytes(cached.read_bytes())
    copy.replace(cached)
    assert watch.changed() is None
    cached.unlink()
    assert watch.changed() is None
    os.truncate(opened, 100)
    assert f"{cached} changed under the run: " in (watch.changed() or "")
