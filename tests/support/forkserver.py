"""Trainer starts without the interpreter's start: a fork server for the process tests.

A trainer process spends about 1.5 s of CPU importing torch, pydantic and its own modules before
it reads a flag, and the process tests start hundreds of them on two cores. The fork server is a
process that imports those modules once and then forks one child per start, as
`multiprocessing`'s forkserver and Android's zygote do: each child is a real process of its own
(its own pid, signals, sockets, files and exit status), that runs the trainer's module as
`python -m` would (`runpy`, as `__main__`, with the caller's argv, environment, working directory
and standard streams), and ends through the interpreter's own exit (atexit, non-daemon threads,
flushed streams).

What a forked child shares with its siblings, and an exec'd trainer would not: the modules
imported before its argv was known (so a module-level read of the environment sees the server's),
and Python's hash seed. The tests that prove something about a process's start (the console
scripts, imports before a refusal, systemd, torchrun, the resume proofs that compare two
interpreters) start it with exec; `ANDREA_TESTS_EXEC=1` starts every trainer so;
tests/process/test_fork_server.py shows a forked and an exec'd run write the same bytes.

The server is started once per test worker, on first use, and is single-threaded: a child of a
threaded process could inherit a lock held by another thread.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

from andrea.daemon.rundir.layout import DAEMON_MODULES

#: Set to 1 to start every trainer with exec, as before the fork server.
EXEC_ENV = "ANDREA_TESTS_EXEC"
#: What a forked child may run: the modules whose imports the server has already paid.
MODULES = (DAEMON_MODULES["trainer"],)
#: Imported once by the server: what a trainer's run imports of its own and of torch, nothing
#: more (not numpy.random, whose global generator every child would then share).
PRELOAD = (
    *MODULES,
    "andrea.daemon.trainer.service.start",
    "andrea.daemon.trainer.service.with_proxy",
    "andrea.daemon.trainer.platform.distributed",
    "andrea.daemon.trainer.factory",
    "andrea.daemon.data.corpus",
    *(
        f"andrea.daemon.data.kinds.{kind}"
        for kind in ("files", "jsonl", "parquet", "text", "tokens")
    ),
)
_HEADER = 1 << 20
#: The Popen arguments a forked child honours; any other (preexec_fn, pass_fds...) means exec.
_KWARGS = {"stdin", "stdout", "stderr", "env", "cwd", "text", "start_new_session"}


def forkable(cmd: list[str], popen: dict[str, Any]) -> str | None:
    """The module a command runs, when the fork server can start it as it is asked to; else None."""
    # pidfd_open (Linux 5.3) is how the server hears of a child's end among its sockets.
    if not hasattr(os, "pidfd_open") or os.environ.get(EXEC_ENV) == "1" or set(popen) - _KWARGS:
        return None
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2] in MODULES:
        return cmd[2]
    return None


# ---------------------------------------------------------------- the server (its own process)


def _serve(path: str) -> None:
    import threading

    for name in PRELOAD:
        __import__(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"the preloaded modules started threads: {threading.enumerate()}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "listener")
    sel.register(sys.stdin, selectors.EVENT_READ, "caller")  # EOF: the test worker is gone
    children: dict[int, socket.socket] = {}  # pidfd -> the connection that asked for the child
    while True:
        for key, _ in sel.select():
            if key.data == "caller":
                return
            if key.data == "listener":
                conn, _ = listener.accept()
                if (pid := _spawn(conn, (listener, sel, children))) is None:
                    conn.close()
                    continue
                pidfd = os.pidfd_open(pid)
                children[pidfd] = conn
                sel.register(pidfd, selectors.EVENT_READ, pid)
                continue
            _, status = os.waitpid(key.data, 0)
            sel.unregister(key.fd)
            os.close(key.fd)
            conn = children.pop(key.fd)
            _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
            conn.close()


def _send(conn: socket.socket, message: dict) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the caller is gone; its child was still reaped


def _spawn(conn: socket.socket, server: tuple) -> int | None:
    data, fds, _, _ = socket.recv_fds(conn, _HEADER, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:
        _close_server(conn, *server)
        _become(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    return pid


def _close_server(
    conn: socket.socket,
    listener: socket.socket,
    sel: selectors.BaseSelector,
    children: dict[int, socket.socket],
) -> None:
    """In the child: close every fd of the server's, detached from its object first, so that no
    object left on the stack below the child can close a number the trainer reuses."""
    sel.close()
    for pidfd, other in children.items():
        os.close(pidfd)
        os.close(other.detach())
    os.close(listener.detach())
    os.close(conn.detach())


def _become(request: dict, fds: list[int]) -> None:
    """In the child: take the caller's streams, environment and directory, and run the module."""
    import runpy

    for sig in range(1, signal.NSIG):
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE):
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = [request["module"], *request["args"]]
    sys.path[0] = os.getcwd()
    # As under `python -m`, the module runs as __main__ only: the copy the server imported (for
    # its imports' sake) is dropped, and runpy has no reason to warn of it.
    sys.modules.pop(request["module"], None)
    # The server's own frames stay below this one: the exit goes through SystemExit, so that
    # the child's interpreter runs its atexit handlers and joins its threads as `python -m` does.
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


# ---------------------------------------------------------------- the client (in the test worker)


class _Server:
    """The fork server of this test worker: started on first use, ended with the worker (its
    stdin closes; children still running are left to end as an exec'd one would)."""

    proc: subprocess.Popen | None = None
    path = ""

    @classmethod
    def address(cls) -> str:
        if cls.proc is None or cls.proc.poll() is not None:
            cls.path = os.path.join(tempfile.mkdtemp(prefix="andrea-fork-"), "sock")
            proc = subprocess.Popen(
                [sys.executable, __file__, cls.path],
                stdin=subprocess.PIPE,  # closed with this worker, and then the server ends
                stdout=subprocess.PIPE,
                text=True,
            )
            assert proc.stdin is not None and proc.stdout is not None
            if proc.stdout.readline() != "ready\n":
                raise RuntimeError("the fork server did not start")
            atexit.register(proc.stdin.close)
            cls.proc = proc
        return cls.path


class ForkedProcess:
    """A child of the fork server, with the part of `subprocess.Popen`'s interface tests use."""

    def __init__(self, cmd: list[str], module: str, **popen: Any) -> None:
        self.args = cmd
        self.returncode: int | None = None
        self.stdin: IO | None = None
        self.stdout: IO | None = None
        self.stderr: IO | None = None
        cwd = os.fspath(popen.get("cwd") or os.getcwd())
        if not os.path.isdir(cwd):  # refused here, as Popen refuses it, before any child exists
            raise FileNotFoundError(f"no such directory: {cwd!r}")
        ends, keep = self._streams(popen)
        request = {
            "module": module,
            "args": cmd[3:],
            "env": popen.get("env") if popen.get("env") is not None else dict(os.environ),
            "cwd": cwd,
            "new_session": bool(popen.get("start_new_session")),
        }
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(_Server.address())
        try:
            socket.send_fds(self._conn, [json.dumps(request).encode()], ends)
        finally:
            for fd in keep:
                os.close(fd)
        self._buffer = b""
        self.pid: int = self._message()["pid"]

    def _streams(self, popen: dict[str, Any]) -> tuple[list[int], list[int]]:
        """The three fds the child gets, and those to close here once sent."""
        text = bool(popen.get("text"))
        ends: list[int] = []
        keep: list[int] = []
        for target, name, mode in ((0, "stdin", "w"), (1, "stdout", "r"), (2, "stderr", "r")):
            how = popen.get(name)
            if how is None:
                ends.append(target)
            elif how == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                ends.append(fd)
                keep.append(fd)
            elif how == subprocess.PIPE:
                r, w = os.pipe()
                mine, theirs = (w, r) if mode == "w" else (r, w)
                ends.append(theirs)
                keep.append(theirs)
                f: IO = os.fdopen(mine, mode + ("" if text else "b"))
                setattr(self, name, f)
            elif how == subprocess.STDOUT and name == "stderr":
                ends.append(ends[1])
            elif isinstance(how, int):
                ends.append(how)
            else:
                ends.append(how.fileno())
        return ends, keep

    def _message(self) -> dict:
        """The server's next line: the child's pid, then its exit status."""
        while b"\n" not in self._buffer:
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError(f"the fork server went away before {self.args!r} ended")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _ended(self, timeout: float | None) -> bool:
        if self.returncode is None:
            if b"\n" not in self._buffer:
                with selectors.DefaultSelector() as sel:
                    sel.register(self._conn, selectors.EVENT_READ)
                    if not sel.select(timeout):
                        return False
            self.returncode = self._message()["returncode"]
            self._conn.close()
        return True

    def poll(self) -> int | None:
        self._ended(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Both captured streams read to their end, then the exit status, as `Popen.communicate`."""
        import threading

        out: dict[str, Any] = {}

        def drain(name: str) -> None:
            f = getattr(self, name)
            out[name] = f.read() if f else None
            if f:
                f.close()

        pumps = [
            threading.Thread(target=drain, args=(n,), daemon=True) for n in ("stdout", "stderr")
        ]
        for t in pumps:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        for t in pumps:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return out.get("stdout"), out.get("stderr")


def start(cmd: list[str], **popen: Any) -> subprocess.Popen | ForkedProcess:
    """`subprocess.Popen(cmd, **popen)`, or a fork of the warm server when it can run cmd."""
    module = forkable(cmd, popen)
    if module is None:
        return subprocess.Popen(cmd, **popen)
    return ForkedProcess(cmd, module, **popen)


def run(cmd: list[str], timeout: float | None = None, **popen: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, capture_output=True, timeout=timeout, **popen)`, forked when it can be."""
    popen.pop("capture_output", None)
    module = forkable(cmd, popen)
    if module is None:
        return subprocess.run(cmd, capture_output=True, timeout=timeout, **popen)
    proc = ForkedProcess(cmd, module, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.wait(), out, err)


if __name__ == "__main__":
    _serve(sys.argv[1])
    # Only the server gets here: a child's exit leaves through _serve as SystemExit.
    os.unlink(sys.argv[1])
    os.rmdir(os.path.dirname(sys.argv[1]))
