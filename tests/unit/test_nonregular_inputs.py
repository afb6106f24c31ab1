"""Files a person names that are no regular file (a FIFO, /dev/zero, a directory): --init-from,
`tokenizer encode --input`, `tokenizer train`'s run.toml, a tokens arm's path. Each is named for
what it is (never "does not exist"), and nothing blocks on a FIFO (an alarm guards each case)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from andrea.control import andreactl
from andrea.daemon.checkpoint.source import SourceError, read_source
from andrea.daemon.config import build_config
from andrea.daemon.data.arms import load_arms
from andrea.daemon.data.sources import SourceRejected

KINDS = {"fifo": "a FIFO", "dev-zero": "a character device", "directory": "a directory"}


def _plant(where: Path, name: str, kind: str) -> Path:
    """`where/name` as a FIFO, a link to /dev/zero (a person's link: followed) or a directory."""
    path = where / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _alarm() -> Iterator[None]:
    def ring(signum: int, frame: object) -> None:
        raise TimeoutError("blocked")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _ctl(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code = andreactl.main(list(argv))
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("kind", KINDS)
def test_init_from(tmp_path: Path, kind: str) -> None:
    path = _plant(tmp_path, "step_000010.bin", kind)
    with pytest.raises(SourceError, match=f"not a regular file \\({KINDS[kind]}\\)"):
        read_source(path)
    with pytest.raises(SourceError, match="no such file"):
        read_source(tmp_path / "step_000020.bin")


@pytest.mark.parametrize("kind", KINDS)
def test_encode_input(tmp_path: Path, kind: str, capsys) -> None:
    path = _plant(tmp_path, "in.txt", kind)
    out = tmp_path / "out.u8"
    code, err = _ctl(capsys, "tokenizer", "encode", "--tokenizer", "bytes", "--input", str(path),
                     "--out", str(out))  # fmt: skip
    assert code == 2 and f"--input {path}: not a regular file ({KINDS[kind]})" in err, err
    assert not out.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_train_run_toml(tmp_path: Path, kind: str, capsys) -> None:
    path = _plant(tmp_path, "run.toml", kind)
    code, err = _ctl(
        capsys, "tokenizer", "train", "--run-dir", str(tmp_path), "--vocab-size", "300"
    )
    assert code == 2 and f"{path}: not a regular file ({KINDS[kind]})" in err, err


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_arm(tmp_path: Path, kind: str) -> None:
    path = _plant(tmp_path, "pre.u16", kind)
    arm = {"name": "pre", "kind": "tokens", "path": "pre.u16", "dtype": "uint16"}
    cfg = build_config({"data": {"arms": [arm], "cache_dir": str(tmp_path / "cache")}},
                       {"preset": "andrea-tiny"})  # fmt: skip
    with pytest.raises(
        SourceRejected, match=f"token file .* is not a regular file \\({KINDS[kind]}"
    ):
        load_arms(cfg.data, tmp_path, cfg.model.vocab_size)
    assert path.exists()
