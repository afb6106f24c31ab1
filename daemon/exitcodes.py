"""Process exit codes of the daemons: one definition, read by the units and the operator tools.

systemd restarts a unit on failure; codes that mean "a person must decide" are listed in the
units' RestartPreventExitStatus so that a bad config never becomes a crash loop.
"""

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
