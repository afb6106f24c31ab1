"""run.toml and policy.toml are read as regular files of bounded size (issue 24, item 4): /dev/zero,
a 64 GiB sparse file, a FIFO or a directory is a configuration error naming the file, at once:
nothing is allocated for it and nothing blocks."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from andrea.daemon.config import ConfigError, load_toml
from andrea.daemon.mixing.policy import PolicyError, load_policy, read_policy_text

GIB = 1 << 30


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _sparse(path: Path) -> None:
    with path.open("wb") as f:
        f.truncate(64 * GIB)


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


KINDS: dict[str, tuple[Callable[[Path], None], str]] = {
    "dev-zero": (_dev_zero, "not a regular file (a character device)"),
    "sparse": (_sparse, "68,719,476,736 bytes, more than the"),
    "fifo": (_fifo, "not a regular file (a FIFO)"),
    "directory": (_directory, "not a regular file (a directory)"),
}


def _returns_within(seconds: float, fn: Callable[[], object]) -> BaseException | None:
    """What `fn` raised (None if it returned), failing the test if it is still blocked after
    `seconds` (a FIFO's open waits for a writer that never comes)."""
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test to judge
            outcome.append(e)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        with open(fn.path, "wb"):  # type: ignore[attr-defined]  # unblock the reader
            pass
        pytest.fail(f"reading {fn.path} blocked")  # type: ignore[attr-defined]
    return outcome[0]


def _reader(load: Callable[[Path], object], path: Path) -> Callable[[], object]:
    def read() -> object:
        return load(path)

    read.path = path  # type: ignore[attr-defined]
    return read


@pytest.mark.parametrize("kind", KINDS)
def test_run_toml_that_is_not_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    make, reason = KINDS[kind]
    path = tmp_path / "run.toml"
    make(path)
    error = _returns_within(10, _reader(load_toml, path))
    assert isinstance(error, ConfigError), error
    assert str(path) in str(error) and reason in str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_policy_toml_that_is_not_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    make, reason = KINDS[kind]
    path = tmp_path / "policy.toml"
    make(path)
    error = _returns_within(10, _reader(load_policy, path))
    assert isinstance(error, PolicyError), error
    assert str(path) in str(error) and reason in str(error)


def test_files_a_person_names_may_be_links(tmp_path: Path) -> None:
    real = tmp_path / "real.toml"
    real.write_text("[arms.code]\ncap = 0.5\n")
    (tmp_path / "policy.toml").symlink_to(real)
    assert load_policy(tmp_path / "policy.toml").arms["code"].cap == 0.5
    real.write_text('preset = "andrea-tiny"\n')
    (tmp_path / "run.toml").symlink_to(real)
    assert load_toml(tmp_path / "run.toml") == {"preset": "andrea-tiny"}


def test_a_run_toml_saved_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    # Editors on Windows write one; it is no TOML statement ("Invalid statement (line 1, column 1)").
    path = tmp_path / "run.toml"
    path.write_bytes(b"\xef\xbb\xbfpreset = 'andrea-tiny'\n[optim]\nlr = 0.002\n")
    assert load_toml(path) == {"preset": "andrea-tiny", "optim": {"lr": 0.002}}
    policy = tmp_path / "policy.toml"
    policy.write_bytes(b"\xef\xbb\xbf[arms.code]\ncap = 0.5\n")
    assert read_policy_text(policy) == "[arms.code]\ncap = 0.5\n"
