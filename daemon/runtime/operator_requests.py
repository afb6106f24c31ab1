"""The operator's requests to a running daemon, by signal (SIGTERM, SIGINT, SIGHUP, SIGUSR1) or over
the control socket (stop, checkpoint, a pivot's hold and resume), kept as flags the training loop
and the proxy read.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Literal

#: Why the daemon was asked to stop: a signal, a control request, the --with-proxy child giving up,
#: a loss record that could not be written, a diverged loss, or a token file that changed under
#: the run (daemon/data/livefiles.py).
StopReason = Literal[
    "sigterm", "sigint", "sighup", "control", "proxy", "disk-full", "diverged", "data-changed"
]


#: Who asked for a checkpoint now: SIGUSR1 or a control request.
CheckpointReason = Literal["sigusr1", "control"]


#: The manifest triggers of checkpoints an operator asked for (a checkpoint request, or a pivot's
#: boundary): audit points, kept by default (see CheckpointConfig). Here rather than beside the
#: manifest model, which imports torch, so that the tools that read triggers need not.
REQUESTED_TRIGGERS = frozenset({"sigusr1", "control", "boundary"})


class OperatorRequests:
    """What the operator asked for, by signal or control message, and not yet acted upon."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stop_reason: StopReason | None = None
        self.checkpoint_reason: CheckpointReason | None = None
        self.boundary_requested = False  # checkpoint at the next cadence boundary (control)
        self.hold_requested = False  # ...and then hold until resumed (a pivot)
        self.resume_requested = False
        self.ignored_signal: str | None = None

    def install(self) -> None:
        """Install the handlers (main thread only).

        - SIGTERM, SIGINT, SIGHUP: finish the step, checkpoint, exit 0. A hangup (the terminal or
          SSH session of a foreground run went away) must not lose work, and nobody is left to
          talk to: it is a stop, like the default action it replaces, but with the checkpoint.
        - SIGUSR1: checkpoint after the current step and continue.
        - SIGUSR2, SIGALRM: ignored, and logged once at the next step boundary (the proxy: at
          its next request or poll): their default action would kill the process without a
          checkpoint (a stray `kill -ALRM`, exit 142), and no meaning was ever given to them.
        """
        for sig, fn in (
            (signal.SIGTERM, self._on_stop),
            (signal.SIGINT, self._on_stop),
            (signal.SIGHUP, self._on_stop),
            (signal.SIGUSR1, self._on_checkpoint),
            (signal.SIGUSR2, self._on_ignored),
            (signal.SIGALRM, self._on_ignored),
        ):
            signal.signal(sig, fn)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        names: dict[int, StopReason] = {
            signal.SIGINT: "sigint",
            signal.SIGHUP: "sighup",
            signal.SIGTERM: "sigterm",
        }
        self.request_stop(names[signum])

    def _on_checkpoint(self, signum: int, frame: FrameType | None) -> None:
        self.request_checkpoint("sigusr1")

    def _on_ignored(self, signum: int, frame: FrameType | None) -> None:
        self.ignored_signal = signal.Signals(signum).name

    def take_ignored_signal(self) -> str | None:
        """The name of an ignored signal received since the last call (for one log line)."""
        name, self.ignored_signal = self.ignored_signal, None
        return name

    def request_stop(self, reason: StopReason) -> None:
        # First reason wins: a second Ctrl-C while the final checkpoint is written must not
        # turn into anything harsher.
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason

    def request_checkpoint(self, reason: CheckpointReason) -> None:
        with self._lock:
            if self.checkpoint_reason is None:
                self.checkpoint_reason = reason  # repeated requests coalesce into one checkpoint

    def request_boundary_checkpoint(self, hold: bool = False) -> None:
        with self._lock:
            self.boundary_requested = True
            self.hold_requested = self.hold_requested or hold
            if hold:
                self.resume_requested = False

    def take_boundary_request(self) -> tuple[bool, bool]:
        """(checkpoint at this boundary?, hold after it?)"""
        with self._lock:
            out = (self.boundary_requested, self.hold_requested)
            self.boundary_requested = self.hold_requested = False
            return out

    def request_resume(self) -> None:
        with self._lock:
            self.resume_requested = True

    def cancel_hold(self) -> None:
        """A pivot's hold was cancelled before its boundary: checkpoint there, but do not hold."""
        with self._lock:
            self.hold_requested = False

    def take_resume(self) -> bool:
        with self._lock:
            resumed, self.resume_requested = self.resume_requested, False
            return resumed

    def take_checkpoint_request(self) -> CheckpointReason | None:
        with self._lock:
            reason, self.checkpoint_reason = self.checkpoint_reason, None
            return reason

    def stop_requested(self) -> bool:
        return self.stop_reason is not None
