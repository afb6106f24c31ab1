"""Reading an arm's files against hostile content and a damaged or full token cache: JSON Lines lines
have a bound (a gzip bomb without a newline included), lone surrogates become U+FFFD, a cache entry
is trusted only when it is what its encoding recorded, and a failed write leaves no temporary file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from andrea.daemon.config import DataConfig
from andrea.daemon.data.arms import load_arms
from tests.support.owndata import PROSE


def _data(tmp_path: Path, arms: list[dict], **extra) -> DataConfig:
    return DataConfig.model_validate({"arms": arms, "cache_dir": str(tmp_path / "cache"), **extra})


_FULL_DISK = """
import resource, sys
from pathlib import Path
from andrea.daemon.config import DataConfig
from andrea.daemon.data.arms import load_arms
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
root = Path(sys.argv[1])
cfg = DataConfig.model_validate({"arms": [{"name": "notes", "kind": "text", "paths": ["notes/*"]}],
                                 "cache_dir": str(root / "cache"), "heldout_fraction": 0.2})
try:
    load_arms(cfg, root, 256)
except OSError as e:
    print(e)
    sys.exit(7)
"""


def test_a_cache_write_that_fails_leaves_no_temporary_file(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes a write past 64 kB fail (EFBIG), as a full disk fails it (ENOSPC): the
    same path in the encoder, without a filesystem of its own."""
    (tmp_path / "notes").mkdir()
    for i in range(20):
        (tmp_path / "notes" / f"n{i}.md").write_text(PROSE * 40)
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = cache / "0123.u8.999999999.tmp"  # a writer killed mid-write (no such pid)
    stale.write_bytes(b"partial")
    res = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path), str(64 << 10)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 7, res.stderr
    assert f"cannot write the token cache in {cache}" in res.stdout, res.stdout
    # Nothing but the entry's lock file, empty (a lock is never removed: a waiter may hold it open).
    left = [p for p in cache.iterdir() if p.suffix != ".lock" or p.stat().st_size]
    assert left == [], left
    # A start with room encodes it.
    cfg = _data(tmp_path, [{"name": "notes", "kind": "text", "paths": ["notes/*"]}])
    (arm,) = load_arms(cfg.model_copy(update={"heldout_fraction": 0.2}), tmp_path, 256)
    assert arm.n_tokens > 64 << 10 and not list(cache.glob("*.tmp"))
