"""Which trainer life the proxy serves, and which peers speak for it.

Any process that can open the proxy's socket can speak the link's protocol, so a `hello` alone
proves nothing. One trainer life at a time writes the run's records, and the proxy knows it by
what a genuine trainer can show and another process cannot take from it:

- the **life**: a secret the trainer process draws at start and sends only to the proxy, in every
  `hello`; the proxy keeps its SHA-256, never the secret;
- the process: its **pid**, and the pid's start time (so that a reused pid is not taken for it);
- the run's **trainer lock** (`rundir.claim`): the flock a trainer holds on this run directory's
  `.trainer.lock` for as long as it lives, with the pid it wrote there.

A `hello` carrying the live life's secret is that life: a reconnect (a lost socket, a restarted
proxy: the live life is kept in `.state.json`) or a new segment after a roll-back. Any other
`hello` would start a new life, and is admitted only once the live one is provably gone from this
run directory: its pid (with its start time) no longer holds the trainer lock, and the lock is
held by the pid the `hello` names. Until then it is refused, naming the live trainer: a second peer
never displaces a live trainer, never gets a segment, never moves the trainer's progress.

Liveness is the lock's, never the pid's alone: a copy of a run directory (`cp -r`) carries the
original's `.state.json`, whose live life is a process that is alive but holds the original's
lock, not the copy's. The copy is a fork of the run: its first trainer begins a new life, numbered
after the copied segments, and the original's trainer is neither waited for nor disturbed.

Losses, evaluations and samples are taken only from peers (socket identities) that said a `hello`
admitted as the live life. What this cannot prove is said in docs/protocol.md ("Who may speak for
the trainer").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from andrea.daemon.rundir.layout import lock_holder
from andrea.protocol import messages

#: The most peers (socket identities) kept bound to the live life: each reconnect of the trainer
#: is a new socket; the oldest are forgotten first.
MAX_BOUND_PEERS = 64


class TrainerLife(BaseModel):
    """The trainer life the proxy serves, as `.state.json` keeps it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    segment: int = Field(ge=1)
    pid: int = Field(ge=1)
    started: str | None = Field(
        None, description="the process's start time (/proc/PID/stat), to tell a reused pid apart"
    )
    life_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def fingerprint(life: str) -> str:
    return hashlib.sha256(life.encode()).hexdigest()


def process_started(pid: int) -> str | None:
    """The start time of live process `pid` (clock ticks after boot), "" for a live process whose
    start time cannot be read, None when no process has that pid (a zombie counts as exited)."""
    try:
        stat: str | None = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # /proc is there, and has no such process
        stat = None
    except OSError:
        stat = None
    if stat is not None:
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state is field 3
        return None if fields[0] in ("Z", "X") else fields[19]  # starttime is field 22
    # Without /proc, whether the pid exists is all there is to know.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return ""


class TrainerPeers:
    """The live trainer life (None before the first `hello`) and the peers bound to it."""

    def __init__(self, run_dir: Path, live: TrainerLife | None) -> None:
        self.run_dir = run_dir
        self.live = live
        self._peers: dict[bytes, str] = {}

    def _is_live(self, hello: messages.Hello) -> bool:
        return (
            self.live is not None
            and hello.life is not None
            and fingerprint(hello.life) == self.live.life_sha256
        )

    def _alive(self, life: TrainerLife) -> bool:
        """Whether `life`'s process still holds this run directory's trainer lock."""
        if lock_holder(self.run_dir, "trainer") != life.pid:
            return False
        started = process_started(life.pid)
        return started is not None and (not life.started or not started or started == life.started)

    def refusal(self, hello: messages.Hello) -> str | None:
        """Why `hello` may not speak for the trainer, or None: it is the live life, or the live
        one is gone and the hello's process holds the trainer lock."""
        live, proven = self.live, self._is_live(hello)
        if live is not None and not proven and self._alive(live):
            return (
                f"{messages.TRAINER_ALIVE}: segment {live.segment} (pid {live.pid}) holds this run, "
                "and another peer cannot displace it"
            )
        if hello.pid is None or hello.life is None:
            return "the hello names no process (pid) and no life: not a trainer of this protocol"
        if proven:
            return None
        holder = lock_holder(self.run_dir, "trainer")
        if holder != hello.pid:
            return (
                f"pid {hello.pid} does not hold this run's trainer lock (it is held by "
                f"{'pid ' + str(holder) if holder else 'no process'})"
            )
        return None

    def admit(self, peer: bytes, hello: messages.Hello, segment: int) -> bool:
        """Make `hello`'s life the live one, running as `segment`, and bind `peer` to it (after
        `refusal` said None). True when the live life changed (it is then written down)."""
        assert hello.pid is not None and hello.life is not None
        life = TrainerLife(
            segment=segment,
            pid=hello.pid,
            started=process_started(hello.pid) or None,
            life_sha256=fingerprint(hello.life),
        )
        changed = life != self.live
        if self.live is None or life.life_sha256 != self.live.life_sha256:
            self._peers.clear()  # the peers of a life that is gone speak for nobody
        self.live = life
        self._peers.pop(peer, None)
        self._peers[peer] = life.life_sha256
        while len(self._peers) > MAX_BOUND_PEERS:
            del self._peers[next(iter(self._peers))]
        return changed

    def speaks_for_live(self, peer: bytes) -> bool:
        """Whether `peer` said a hello admitted as the live life."""
        return self.live is not None and self._peers.get(peer) == self.live.life_sha256
