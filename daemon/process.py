"""Process plumbing both daemons share: signal flags, systemd notification, logging setup.

Signals become flags; the training loop acts on them at the next safe point.

Work inside a handler (a checkpoint write, say) can hang or corrupt state when the signal lands
in the middle of a step or of another write (Lightning #21406); so handlers only record what was
asked. Long operations that are not training steps (data preparation, sampling, waiting) poll
`stop_requested` so that a SIGTERM there is honoured at once, not at some later step boundary.

systemd notification (Type=notify): readiness, status, watchdog, stop-timeout extension. It does
nothing when not started by systemd (no NOTIFY_SOCKET), so the daemons run the same way in a
terminal, in tests and under a unit.

Nothing here imports torch: the entry points install their handlers before anything slow.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Literal

from .rundir import RUN_DIR_ENV

log = logging.getLogger(__name__)

#: How long the stop timeout is extended at most while one final checkpoint is being written.
EXTEND_LIMIT = 3600.0

try:
    from systemd import daemon as _sd
except ImportError:  # off Linux, or a machine where it could not be built (scripts/gpu_wheels.sh)
    _sd = None


#: Why the daemon was asked to stop: a signal, a control request, the --with-proxy child giving up,
#: or a loss record that could not be written.
StopReason = Literal["sigterm", "sigint", "sighup", "control", "proxy", "disk-full"]
#: Who asked for a checkpoint now: SIGUSR1 or a control request.
CheckpointReason = Literal["sigusr1", "control"]
#: The manifest triggers of checkpoints an operator asked for (a checkpoint request, or a pivot's
#: boundary): audit points, kept by default (see CheckpointConfig). Here rather than beside the
#: manifest model, which imports torch, so that the tools that read triggers need not.
REQUESTED_TRIGGERS = frozenset({"sigusr1", "control", "boundary"})


class SignalFlags:
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
        - SIGUSR2: ignored, and logged once at the next step boundary: its default action would
          kill the process without a checkpoint, and no meaning was ever given to it.
        """
        for sig, fn in (
            (signal.SIGTERM, self._on_stop),
            (signal.SIGINT, self._on_stop),
            (signal.SIGHUP, self._on_stop),
            (signal.SIGUSR1, self._on_checkpoint),
            (signal.SIGUSR2, self._on_ignored),
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


@functools.cache
def _no_notifications() -> None:
    log.warning(
        "started by systemd, but systemd-python is not installed: no readiness, status or "
        "watchdog notifications (a Type=notify unit will time out)"
    )


class Notifier:
    def __init__(self, enabled: bool = True) -> None:
        """`enabled=False` for the ranks of a torchrun job other than global rank 0: they inherit
        NOTIFY_SOCKET from the agent, but one voice (rank 0's) speaks for the job."""
        wanted = bool(enabled and os.environ.get("NOTIFY_SOCKET"))
        if wanted and _sd is None:
            _no_notifications()
        self.enabled = wanted and _sd is not None
        usec = int(os.environ.get("WATCHDOG_USEC", "0") or 0) if self.enabled else 0
        # Ping at half the watchdog interval, as sd_watchdog_enabled(3) recommends.
        self._watchdog_every = usec / 2e6 if usec else 0.0
        self._last_ping = 0.0

    def _send(self, *fields: str) -> None:
        if self.enabled:
            _sd.notify("\n".join(fields))

    def ready(self, status: str) -> None:
        self._send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def tick(self) -> None:
        """Watchdog keep-alive; cheap to call often, sends at most every WATCHDOG_USEC/2."""
        if self._watchdog_every:
            now = time.monotonic()
            if now - self._last_ping >= self._watchdog_every:
                self._last_ping = now
                self._send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask systemd for `seconds` more from now to finish stopping."""
        self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    @contextlib.contextmanager
    def keepalive(
        self, what: str, extend: float | None = None, limit: float = EXTEND_LIMIT
    ) -> Iterator[None]:
        """While the body runs (a checkpoint write that blocks the main thread), keep systemd
        informed from a helper thread: WATCHDOG=1, and with `extend` an EXTEND_TIMEOUT_USEC of
        that many seconds, re-sent every `extend`/3 s for at most `limit` seconds. One extension
        alone would lapse during a write slower than it, and systemd would SIGKILL a clean stop
        half-way; the limit still lets systemd end a write that hangs for good (a dead disk)."""
        if not self.enabled:
            yield
            return
        period = min(x for x in (extend and extend / 3, self._watchdog_every or None, 10.0) if x)
        done = threading.Event()
        start = time.monotonic()

        def beat() -> None:
            next_log = 60.0
            while True:
                if extend and time.monotonic() - start < limit:
                    self.extend_timeout(extend)
                if self._watchdog_every:
                    self._send("WATCHDOG=1")
                if done.wait(period):
                    return
                waited = time.monotonic() - start
                self._send(f"STATUS={what} ({waited:.0f} s so far)")
                if waited >= next_log:
                    log.info("%s: still in progress after %.0f s", what, waited)
                    next_log += 60.0

        t = threading.Thread(target=beat, name="sd-keepalive", daemon=True)
        t.start()
        try:
            yield
        finally:
            done.set()
            t.join()

    def stopping(self) -> None:
        # Final from systemd 259 on: only at the real exit, never for checkpoint-and-continue.
        self._send("STOPPING=1")


#: Set by `andrea-trainer --with-proxy` for its proxy: both write to one terminal, and every line
#: says which process wrote it.
LOG_TAG_ENV = "ANDREA_LOG_TAG"


def add_run_dir_argument(parser: argparse.ArgumentParser) -> None:
    """`--run-dir`, the same for both daemons: $ANDREA_RUN_DIR stands in for it, as for andreactl."""
    from_env = os.environ.get(RUN_DIR_ENV)
    parser.add_argument(
        "--run-dir",
        type=Path,
        required=not from_env,
        default=Path(from_env) if from_env else None,
        metavar="DIR",
        help=f"the run's directory (created if missing; default: ${RUN_DIR_ENV})",
    )


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, the same for both daemons (the trainer passes its own to its proxy)."""
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="least severe level logged (default: INFO)",
    )


def setup_logging(
    level: str, identifier: str = "andrea-trainer", tag: str | None = None, rank: int | None = None
) -> None:
    """journald with structured fields under systemd, plain stderr lines elsewhere, prefixed with
    ``[tag]`` when ``tag`` (or $ANDREA_LOG_TAG) is set. `rank`: the global rank of a torchrun
    worker, which tags its lines, in the journal too (a job's workers share one unit)."""
    handler: logging.Handler
    prefix = f"[rank {rank}] " if rank is not None else ""
    if os.environ.get("JOURNAL_STREAM") or os.environ.get("INVOCATION_ID"):
        try:
            from systemd.journal import JournalHandler

            handler = JournalHandler(SYSLOG_IDENTIFIER=identifier)
            # The journal has its own time, priority and logger fields: MESSAGE is the message
            # alone (basicConfig would otherwise prefix "INFO:logger:").
            handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
        except ImportError:
            handler = logging.StreamHandler()
    else:
        handler = logging.StreamHandler()
        tag = tag or os.environ.get(LOG_TAG_ENV) or (f"rank {rank}" if rank is not None else None)
        prefix = f"[{tag}] " if tag else ""
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
        )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
