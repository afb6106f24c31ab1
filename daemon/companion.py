"""The proxy of a one-command run (`andrea-trainer --with-proxy`): started, watched and stopped by
the trainer.

Without a watcher a proxy that exits leaves the trainer waiting for assignments forever. So a
thread waits on the child and decides, by its exit code (daemon/exitcodes.py):

- an exit a restart cannot cure (bad config or policy 2, the disk full 3, resume refused 4, data 5):
  the trainer is asked to stop — it checkpoints — and exits with the proxy's code, after the
  proxy's own error line in the log;
- anything else (a crash, a signal, an exit 0 the trainer did not ask for): the proxy is restarted,
  at most RESTARTS times within WINDOW seconds; past that the trainer stops the same way with 1.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .exitcodes import ExitCode
from .process import LOG_TAG_ENV, SignalFlags

log = logging.getLogger(__name__)

RESTARTS = 3
WINDOW = 60.0
#: Proxy exits that a restart would only repeat.
INCURABLE = (
    ExitCode.CONFIG_ERROR,
    ExitCode.CHECKPOINT_FAILED,
    ExitCode.RESUME_REFUSED,
    ExitCode.DATA_ERROR,
)


class Companion:
    """Runs andrea-proxy beside the trainer and reacts to its exits."""

    def __init__(
        self,
        run_dir: Path,
        flags: SignalFlags,
        log_level: str,
        policy: Path | None,
        pivot: bool = False,
    ) -> None:
        self.run_dir = run_dir
        self.flags = flags
        self.cmd = [
            sys.executable,
            "-m",
            "andrea.daemon.proxy_cli",
            "--run-dir",
            str(run_dir),
            "--log-level",
            log_level,
        ]
        if policy is not None:
            self.cmd += ["--policy", str(policy)]
        if pivot:
            self.cmd += ["--pivot"]
        #: The code the trainer must exit with because of the proxy, once it gave up on it.
        self.exit_code: ExitCode | None = None
        self._stopping = threading.Event()
        self._starts: list[float] = []
        self.proc = self._start()
        self._thread = threading.Thread(target=self._watch, name="proxy-watch", daemon=True)
        self._thread.start()

    def _start(self) -> subprocess.Popen:
        log.info("starting andrea-proxy for %s", self.run_dir)
        self._starts.append(time.monotonic())
        # Its own session, so that a terminal's Ctrl-C reaches only the trainer: the proxy must
        # outlive the trainer's final records, then stop.
        return subprocess.Popen(
            self.cmd,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
            env={**os.environ, LOG_TAG_ENV: "proxy"},
        )

    def _watch(self) -> None:
        while True:
            code = self.proc.wait()
            if self._stopping.is_set():
                return
            name = _describe(code)
            if code in INCURABLE:
                self._give_up(ExitCode(code), f"andrea-proxy exited with {name}")
                return
            recent = [t for t in self._starts if time.monotonic() - t < WINDOW]
            if len(recent) > RESTARTS:
                self._give_up(
                    ExitCode.FAILURE,
                    f"andrea-proxy exited with {name}, its {len(recent)}th exit within {WINDOW:.0f} s",
                )
                return
            log.warning("andrea-proxy exited with %s; restarting it", name)
            if self._stopping.wait(1.0):
                return
            self.proc = self._start()

    def _give_up(self, code: ExitCode, why: str) -> None:
        log.error(
            "%s: a restart cannot cure that; checkpointing and stopping with exit code %d (%s)",
            why,
            code,
            code.name,
        )
        self.exit_code = code
        self.flags.request_stop("proxy")

    def stop(self) -> None:
        """Stop the proxy (after the trainer's final records) and the watcher."""
        self._stopping.set()
        proc = self.proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.error("andrea-proxy did not stop within 30 s; killing it")
                proc.kill()
                proc.wait()
        self._thread.join(timeout=5)


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    try:
        return f"code {code} ({ExitCode(code).name})"
    except ValueError:
        return f"code {code}"


def _terminate_with_parent() -> None:
    # If the trainer is SIGKILLed (OOM killer, say), its proxy must not live on as an orphan
    # holding the run's proxy lock: the kernel sends it SIGTERM, and it stops cleanly.
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
