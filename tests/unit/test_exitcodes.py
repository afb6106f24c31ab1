"""What an unexpected exception exits with: only what a restart may cure is exit 1 (restarted)."""

from __future__ import annotations

import errno
import os

import pytest

from andrea.daemon.runtime.exitcodes import NO_RESTART, ExitCode, for_unexpected


class OutOfMemoryError(RuntimeError):
    """Named as torch's is (torch.OutOfMemoryError): matched by name, torch is not imported."""


@pytest.mark.parametrize(
    "exc",
    [
        MemoryError(),
        OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 GiB"),
        PermissionError(errno.EACCES, "Permission denied", "/var/lib/andrea/r/.trainer.lock"),
        OSError(errno.EROFS, "Read-only file system", "/var/lib/andrea/r"),
    ],
)
def test_errors_a_restart_cannot_cure_are_not_restarted(exc: BaseException) -> None:
    code, advice = for_unexpected(exc)
    assert code in NO_RESTART and code != ExitCode.FAILURE
    assert "not restarted" in advice


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EIO, "Input/output error"),
        RuntimeError("something nobody foresaw"),
    ],
)
def test_other_errors_exit_1_and_say_that_the_start_limit_ends_a_loop(exc: BaseException) -> None:
    code, advice = for_unexpected(exc)
    assert code == ExitCode.FAILURE
    assert "start limit" in advice and repr(exc) in advice


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_is_exit_3_wherever_it_strikes(number: int) -> None:
    # Space may be freed: restarted (not in NO_RESTART), and the advice says what cures it.
    code, advice = for_unexpected(OSError(number, os.strerror(number)))
    assert code == ExitCode.CHECKPOINT_FAILED and code not in NO_RESTART
    assert "free space" in advice


def test_torchs_failed_cpu_allocation_is_not_restarted() -> None:
    """torch reports a CPU allocation it cannot make (a model built too large) as a plain
    RuntimeError; a real one, of a petabyte, is refused by any allocator without touching memory."""
    import torch

    with pytest.raises(RuntimeError) as failed:
        torch.empty(1 << 50, dtype=torch.uint8)
    code, advice = for_unexpected(failed.value)
    assert code == ExitCode.CONFIG_ERROR, advice
    assert "out of memory" in advice and "vocab_size" in advice
