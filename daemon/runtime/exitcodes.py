"""Process exit codes of the daemons: one definition, read by the units and the operator tools.

systemd restarts a unit on failure; codes that mean "a person must decide" are listed in the
units' RestartPreventExitStatus so that a bad config never becomes a crash loop.
"""

import errno
from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    """Clean exit: the newest state is in a durable checkpoint (or nothing was trained)."""
    FAILURE = 1
    """Unexpected error; a restart resumes from the newest valid checkpoint."""
    CONFIG_ERROR = 2
    """Bad command line, run.toml or policy: restarting cannot help."""
    CHECKPOINT_FAILED = 3
    """The final checkpoint could not be written (e.g. disk full); the previous one stays valid."""
    RESUME_REFUSED = 4
    """The run directory holds checkpoints this run cannot resume exactly (other model, changed
    data, none intact): the operator must decide. Restarting cannot help."""
    DATA_ERROR = 5
    """A configured data source is missing or unreadable."""


#: Codes after which an automatic restart would only repeat the failure.
NO_RESTART = (ExitCode.CONFIG_ERROR, ExitCode.RESUME_REFUSED, ExitCode.DATA_ERROR)


#: Permission problems do not go away by themselves: a restart would only repeat them.
_PERMANENT_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})

#: A full disk (or quota, or file size limit): CHECKPOINT_FAILED wherever it strikes, freeing
#: space cures it.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


#: How torch reports an allocation that failed as a plain RuntimeError: the CPU allocator (a model
#: built too large), CUDA's caching allocator and the CUDA runtime.
_OOM_MESSAGES = (
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "CUDA out of memory",
    "CUDA error: out of memory",
)


def _out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def for_unexpected(exc: BaseException) -> tuple[ExitCode, str]:
    """The exit code for an exception nothing else handled, and a log line that says what
    happens next (the journal's last lines are what `systemctl status` shows).

    Only an error that a restart may cure exits FAILURE: systemd restarts the unit, and its start
    limit ends a loop. Out of memory at a fixed model and batch size, or a permission the service
    lacks, fails the same way on every start: those exit CONFIG_ERROR, never restarted.
    """
    if _out_of_memory(exc):
        return ExitCode.CONFIG_ERROR, (
            f"out of memory ({exc!r}); exit 2, not restarted: the model or its batch does not fit"
            " this machine: lower --batch-size, use a smaller --preset, or a smaller [model]"
            " vocab_size (`andreactl plan` sizes them)"
        )
    if disk_full(exc):
        return ExitCode.CHECKPOINT_FAILED, (
            f"{exc}; exit 3: free space, then restart; the newest valid checkpoint is resumed"
        )
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return ExitCode.CONFIG_ERROR, (
            f"{exc}; exit 2, not restarted: give the service's user access to that path"
        )
    return ExitCode.FAILURE, (
        f"unexpected error ({exc!r}); exit 1: under systemd the unit restarts and resumes from"
        " the newest valid checkpoint, and 5 failed starts within 15 min stop it (start limit,"
        " see docs/operations.md)"
    )
