"""The proxy of a one-command run (`andrea-trainer --with-proxy`): started, watched and stopped by
the trainer.

Without a watcher a proxy that exits leaves the trainer waiting for assignments forever. So a
thread waits on the child and decides, by its exit code (daemon/runtime/exitcodes.py):

- an exit a restart cannot cure (bad config or policy 2, the disk full 3, resume refused 4, data 5):
  the trainer is asked to stop — it checkpoints — and exits with the proxy's code, after the
  proxy's own error line in the log;
- a clean exit 0 the trainer did not ask for: a person stopped the proxy (`kill -TERM`), as the
  manual pivot does (docs/operations.md). The trainer trains on (and holds once its prefetched arms
  run out) and waits up to `grace` seconds for an andrea-proxy started by hand, which it then uses
  (it *adopts* it). Only when none comes does it start its own again: starting it at once would
  take the run's proxy lock from the person's proxy, which would then fail;
- anything else (a crash, a signal): the proxy is restarted after a second, at most RESTARTS times
  within WINDOW seconds; past that the trainer stops the same way with 1.

Whenever another andrea-proxy serves the run (found by its lock, `rundir.lock_holder`: the
flock held on this run directory's lock file, never a pid the file names, which a copied run
directory carries over from its original), the trainer uses it instead of starting one, and follows
it: when it exits, the same grace applies. An adopted proxy is stopped with the trainer, as its
own child is: one command, one stop; it is signalled only while it holds this run directory's
proxy lock (`rundir.signal_holder`). The trainer claims the run's trainer lock before any of this
(daemon/trainer/service/cli.py): a second `--with-proxy` on a live run is refused before it
adopts, and so stops, the live run's proxy.

Only the first start gets the command line's `--policy` and `--pivot`: a later one runs under the
run's policy in force (`RUN_DIR/policy.toml`), as a restart under systemd does, so that a restart
after a pivot neither undoes it nor is refused for differing from the first policy.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from andrea.daemon.rundir.layout import (
    DAEMON_MODULES,
    POLICY_FILE,
    AlreadyRunning,
    lock_holder,
    signal_holder,
)
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.runtime.logsetup import LOG_TAG_ENV
from andrea.daemon.runtime.operator_requests import OperatorRequests

log = logging.getLogger(__name__)

RESTARTS = 3
WINDOW = 60.0
#: How long the trainer waits for a proxy started by hand after a person stopped its own
#: (`--proxy-grace`): the manual pivot's three commands, an editor included, fit in it.
GRACE = 300.0
#: How often the trainer looks for a proxy started by hand, and whether an adopted one still runs.
POLL = 0.2
#: How long a proxy has to write its state and exit after the trainer's SIGTERM.
STOP_TIMEOUT = 30.0
#: Proxy exits that a restart would only repeat.
INCURABLE = (
    ExitCode.CONFIG_ERROR,
    ExitCode.CHECKPOINT_FAILED,
    ExitCode.RESUME_REFUSED,
    ExitCode.DATA_ERROR,
)

#: A step of the watcher: it returns the next one, or None when the watch is over.
Step = Callable[[], "Step | None"]


class ProxyChild:
    """Runs andrea-proxy beside the trainer (or uses one started by hand) and reacts to its exits."""

    def __init__(
        self,
        run_dir: Path,
        flags: OperatorRequests,
        log_level: str,
        policy: Path | None,
        pivot: bool = False,
        grace: float = GRACE,
    ) -> None:
        self.run_dir = run_dir
        self.flags = flags
        self.grace = grace
        self.cmd = [
            sys.executable,
            "-m",
            DAEMON_MODULES["proxy"],
            "--run-dir",
            str(run_dir),
            "--log-level",
            log_level,
        ]
        self._first_args = ["--policy", str(policy)] if policy is not None else []
        self._first_args += ["--pivot"] if pivot else []
        #: The code the trainer must exit with because of the proxy, once it gave up on it.
        self.exit_code: ExitCode | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._starts: list[float] = []
        #: The trainer's own proxy process, while it has one.
        self.proc: subprocess.Popen | None = None
        #: The pid of a proxy started by hand that the trainer uses, while it has one.
        self.adopted: int | None = None
        self._adopted_any = False
        other = lock_holder(run_dir, "proxy")
        if other is not None and pivot:
            raise AlreadyRunning(
                f"--pivot: andrea-proxy (pid {other}) already runs on {run_dir} and would not "
                f"make the pivot; stop it first (kill -TERM {other}), or use `andreactl pivot`"
            )
        first: Step = self._follow if other is not None else self._own
        if other is not None:
            self._adopt(other)
        else:
            self.proc = self._start()
        self._thread = threading.Thread(
            target=self._watch, args=(first,), name="proxy-watch", daemon=True
        )
        self._thread.start()

    def _start(self) -> subprocess.Popen:
        # The first proxy of this trainer, unless one started by hand ran first (which may have
        # pivoted), applies the command line's policy; the policy file is absent only if none did.
        first = not self._starts and not self._adopted_any
        extra = self._first_args if first or not (self.run_dir / POLICY_FILE).exists() else []
        if self._first_args and not extra:
            log.info(
                "starting andrea-proxy for %s under the run's policy in force (%s), not %s: a "
                "restart never changes the policy",
                self.run_dir,
                POLICY_FILE,
                " ".join(self._first_args),
            )
        else:
            log.info("starting andrea-proxy for %s", self.run_dir)
        self._starts.append(time.monotonic())
        # Its own session, so that a terminal's Ctrl-C reaches only the trainer: the proxy must
        # outlive the trainer's final records, then stop.
        return subprocess.Popen(
            self.cmd + extra,
            start_new_session=True,
            preexec_fn=_terminate_with_parent,
            env={**os.environ, LOG_TAG_ENV: "proxy"},
        )

    def _start_own(self) -> Step | None:
        with self._lock:
            if self._stopping.is_set():
                return None
            self.proc = self._start()
        return self._own

    def _watch(self, first: Step) -> None:
        step: Step | None = first
        while step is not None and not self._stopping.is_set():
            step = step()

    def _own(self) -> Step | None:
        """Wait for the trainer's own proxy to exit, and decide what follows."""
        assert self.proc is not None
        pid, code = self.proc.pid, self.proc.wait()
        if self._stopping.is_set():
            return None
        name = _describe(code)
        other = lock_holder(self.run_dir, "proxy")
        if other is not None and other != pid:
            log.warning("andrea-proxy (pid %d) exited with %s", pid, name)
            return self._adopt(other)
        if code == ExitCode.OK:
            log.warning(
                "andrea-proxy (pid %d) stopped cleanly without the trainer asking: a person "
                "stopped it. Training goes on (it holds once its prefetched arms run out); waiting "
                "up to %.0f s (--proxy-grace) for an andrea-proxy started by hand (the manual "
                "pivot, docs/operations.md) before the trainer starts its own again",
                pid,
                self.grace,
            )
            return self._await
        if code in INCURABLE:
            self._give_up(ExitCode(code), f"andrea-proxy exited with {name}")
            return None
        recent = [t for t in self._starts if time.monotonic() - t < WINDOW]
        if len(recent) > RESTARTS:
            self._give_up(
                ExitCode.FAILURE,
                f"andrea-proxy exited with {name}, its {len(recent)}th exit within {WINDOW:.0f} s",
            )
            return None
        log.warning("andrea-proxy exited with %s; restarting it", name)
        if self._stopping.wait(1.0):
            return None
        if (other := lock_holder(self.run_dir, "proxy")) is not None:
            return self._adopt(other)
        return self._start_own()

    def _await(self) -> Step | None:
        """Wait the grace period for a proxy started by hand; else start the trainer's own."""
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            if (other := lock_holder(self.run_dir, "proxy")) is not None:
                return self._adopt(other)
            if self._stopping.wait(POLL):
                return None
        log.warning(
            "no andrea-proxy was started within %.0f s (--proxy-grace); the trainer starts its own",
            self.grace,
        )
        return self._start_own()

    def _adopt(self, pid: int) -> Step:
        with self._lock:
            self.proc, self.adopted, self._adopted_any = None, pid, True
        log.warning(
            "andrea-proxy (pid %d), started by hand, serves %s: the trainer uses it, starts none "
            "of its own while it runs, and stops it when the trainer stops",
            pid,
            self.run_dir,
        )
        return self._follow

    def _follow(self) -> Step | None:
        """Watch an adopted proxy until it exits; then the grace applies again."""
        pid = self.adopted
        while lock_holder(self.run_dir, "proxy") == pid:
            if self._stopping.wait(POLL):
                return None
        with self._lock:
            self.adopted = None
        if (other := lock_holder(self.run_dir, "proxy")) is not None:
            return self._adopt(other)
        log.warning(
            "andrea-proxy (pid %s), started by hand, has exited; waiting up to %.0f s "
            "(--proxy-grace) for another before the trainer starts its own",
            pid,
            self.grace,
        )
        return self._await

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
        """Stop the proxy, the trainer's own or an adopted one (after the trainer's final
        records), and the watcher."""
        with self._lock:
            self._stopping.set()
            proc, adopted = self.proc, self.adopted
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log.error("andrea-proxy did not stop within %.0f s; killing it", STOP_TIMEOUT)
                proc.kill()
                proc.wait()
        if adopted is not None:
            self._stop_adopted(adopted)
        self._thread.join(timeout=5)

    def _stop_adopted(self, pid: int) -> None:
        try:
            if not signal_holder(self.run_dir, "proxy", pid, signal.SIGTERM):
                if lock_holder(self.run_dir, "proxy") == pid:
                    log.warning(
                        "an andrea-proxy holds the proxy lock of %s, but pid %d, which it wrote "
                        "there, is not its holder here (another pid namespace?): the trainer "
                        "leaves it running; stop it where it runs",
                        self.run_dir,
                        pid,
                    )
                return  # else it has exited: nothing to stop
            log.info("stopping andrea-proxy (pid %d), started by hand, with the trainer", pid)
            deadline = time.monotonic() + STOP_TIMEOUT
            while lock_holder(self.run_dir, "proxy") == pid:
                if time.monotonic() > deadline:
                    log.error("andrea-proxy (pid %d) did not stop in time; killing it", pid)
                    signal_holder(self.run_dir, "proxy", pid, signal.SIGKILL)
                    return
                time.sleep(POLL)
        except PermissionError:
            log.error(
                "andrea-proxy (pid %d) runs as another user; the trainer cannot stop it: stop it "
                "yourself (kill -TERM %d)",
                pid,
                pid,
            )


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
