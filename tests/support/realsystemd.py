"""A real systemd, PID 1 of its own namespaces, for tests that drive the units with systemctl.

`SystemdMachine.boot()` runs tests/systemd/boot.sh under
`unshare --pid --fork --mount --mount-proc --uts --ipc`: fresh tmpfs mounts on /tmp /run /var/tmp
/var/log /var/lib /var/cache and /etc/andrea, a copy-on-write /etc, the units installed by
scripts/install-units.sh into the one directory SYSTEMD_UNIT_PATH names (with journald and stub
targets), then `exec /lib/systemd/systemd`. Everything is driven from outside with
`nsenter -t PID -m -p` and ended by SIGKILL to that PID, which takes the whole namespace with it.

Files the test prepares before booting go under `scratch` (the same path inside and outside):
`units-extra/` is copied into the unit directory (drop-ins), `andrea/` into /etc/andrea (env files).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BOOT = REPO / "tests" / "systemd" / "boot.sh"
UNSHARE = ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "--uts", "--ipc"]
#: What a plain root shell has: no ANDREA_* variable, nothing from the test's environment.
PLAIN_ENV = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


def unavailable() -> str | None:
    """Why a real systemd cannot be booted here, or None when it can."""
    if os.geteuid() != 0:
        return "a private systemd needs root (mount and pid namespaces)"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (util-linux)"
    if not os.access("/lib/systemd/system/systemd-journald.service", os.R_OK) or not os.access(
        "/lib/systemd/systemd", os.X_OK
    ):
        return "systemd is not installed (scripts/setup.sh installs it)"
    probe = subprocess.run(
        [*UNSHARE, "sh", "-c", "mount --make-rprivate / && mount -t tmpfs tmpfs /tmp"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return (
            f"unshare cannot create private mount and pid namespaces here: {probe.stderr.strip()}"
        )
    return None


def _interpreter_paths() -> list[str]:
    """The installation the venv's python comes from, when it is outside the checkout: the
    service user must be able to run it (a pyenv under /root is not, on the host)."""
    home = Path(os.path.realpath(REPO / ".venv" / "bin" / "python")).parents[1]
    return [] if home.is_relative_to(REPO) or str(home) == "/usr" else [str(home)]


class SystemdMachine:
    """One booted systemd; `sh` runs a plain root shell inside it."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.proc: subprocess.Popen | None = None
        self.pid = 0

    # ---- life ---------------------------------------------------------------------------------

    def boot(self, timeout: float = 60) -> None:
        # The child keeps its own descriptor of the log; this process's copy closes at once.
        with open(self.scratch / "boot.log", "wb") as log:
            self.proc = subprocess.Popen(
                [*UNSHARE, str(BOOT), str(self.scratch), str(REPO), *_interpreter_paths()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.pid:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            try:
                self.pid = int(children.read_text().split()[0])
            except (FileNotFoundError, IndexError, ValueError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the namespace did not start:\n{self.boot_log()}") from None
                time.sleep(0.05)

        # Up once the manager answers and journald runs (the units log to it).
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the machine's PID 1 exited:\n{self.boot_log()}")
            return (
                self.sh("systemctl is-active systemd-journald.service").stdout.strip() == "active"
            )

        try:
            self.wait_until(up, max(1.0, deadline - time.monotonic()), "systemd and journald")
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the namespace's PID 1: the kernel then kills everything in it."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def boot_log(self) -> str:
        return (self.scratch / "boot.log").read_text(errors="replace")

    # ---- driving it ---------------------------------------------------------------------------

    def sh(
        self, cmd: str, timeout: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess:
        """Run `cmd` in a plain root shell inside the machine (no variable of the test's)."""
        res = subprocess.run(
            ["nsenter", "-t", str(self.pid), "-m", "-p", *PLAIN_ENV, "bash", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"`{cmd}` exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        return res

    def systemctl(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        return self.sh("systemctl " + shlex.join(args), timeout=timeout, check=check).stdout

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, "-p", ",".join(props), check=False)
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def prop(self, unit: str, name: str) -> str:
        return self.show(unit, name).get(name, "")

    def journal(self, *units: str, output: str = "cat") -> str:
        args = " ".join(f"-u {shlex.quote(u)}" for u in units)
        return self.sh(f"journalctl --no-pager -o {output} {args}").stdout

    def path(self, inside: str | Path) -> Path:
        """The host path of a path inside the machine (through its PID 1's root)."""
        return Path(f"/proc/{self.pid}/root") / str(inside).lstrip("/")

    def daemon_reload(self) -> None:
        self.systemctl("daemon-reload")

    def write_env(self, run: str, *lines: str) -> None:
        """The run's /etc/andrea/RUN.env, e.g. 'ANDREA_TRAINER_ARGS="--preset andrea-tiny"'."""
        self.path(f"/etc/andrea/{run}.env").write_text("".join(f"{line}\n" for line in lines))

    def write_dropin(self, unit: str, name: str, text: str) -> None:
        """A drop-in for `unit` in the machine's unit directory (daemon_reload to apply)."""
        d = self.path(f"/run/andrea-test/units/{unit}.d")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.conf").write_text(text)

    def wait_until(
        self,
        cond: Callable[[], object],
        timeout: float = 60,
        what: str = "a condition",
        show: tuple[str, ...] = (),
    ) -> object:
        """`cond()` once it is true; AssertionError after `timeout`, with the last journal lines of
        the units in `show` (what they did instead)."""
        deadline = time.monotonic() + timeout
        while True:
            if result := cond():
                return result
            if time.monotonic() > deadline:
                tails = "".join(
                    f"\n--- {u}:\n" + "\n".join(self.journal(u).splitlines()[-25:]) for u in show
                )
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tails}")
            time.sleep(0.2)
