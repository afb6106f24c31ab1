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


def for_unexpected(exc: BaseException) -> tuple[ExitCode, str]:
    """The exit code for an exception nothing else handled, and a log line that says what
    happens next (the journal's last lines are what `systemctl status` shows).

    Only an error that a restart may cure exits FAILURE: systemd restarts the unit, and its start
    limit ends a loop. Out of memory at a fixed model and batch size, or a permission the service
    lacks, fails the same way on every start: those exit CONFIG_ERROR, never restarted.
    """
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return ExitCode.CONFIG_ERROR, (
            f"out of memory ({exc!r}); exit 2, not restarted: lower --batch-size or use a"
            " smaller --preset"
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
