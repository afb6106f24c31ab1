"""`andreactl pivot` killed (SIGKILL) at five moments of a pivot: the proxy runs the pivot, so the
client's death leaves nothing to clean up. The run ends training on one consistent phase, with
the same checkpoints (byte for byte) and the same losses as the run whose pivots were done whole;
a client killed before its request reached the proxy pivots nothing.

Each run pivots four times, after steps 20, 40, 60 and 80 (two policies, in turn); in one run the
clients are killed, one moment a pivot, and the client of a fifth request is killed before the
request reached the proxy; one reference run makes the four pivots whole. The moments are made
exact with the proxy's test-only pauses (ANDREA_PIVOT_PAUSE, daemon/mixing/pivot_orchestrator.py):
the proxy waits after a stage, serving the trainer's link meanwhile, while the test kills the
client. The trainer is stopped (SIGSTOP) from a checkpoint until the proxy has asked it to hold,
so that each pivot holds at the next boundary, the same in every run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.pivot import POLICY, ctl_bg, proxy, stop

EVERY = 10
#: The pivots' boundaries; the trainer is stopped at the checkpoint before each.
BOUNDARIES = (2 * EVERY, 4 * EVERY, 6 * EVERY, 8 * EVERY)
STEPS = BOUNDARIES[-1] + EVERY
SECOND_POLICY = POLICY.replace("cap = 0.0", "cap = 0.5", 1)
#: The policy each pivot asks for: each differs from the one in force, which a pivot needs.
POLICIES = (POLICY, SECOND_POLICY, POLICY, SECOND_POLICY)
#: The moments after which the proxy pauses, and the killed run's clients are killed, in turn.
MOMENTS = ("accepted", "holding", "committed", "released")
WAIT = 120
PAUSE_S = 1.0

Outcome = tuple[dict[str, bytes], list[tuple[int, float, str, int]]]


def _outcome(run: Path) -> Outcome:
    """What a run leaves: its checkpoints' bytes and its loss curve."""
    bins = {f.name: f.read_bytes() for f in sorted(run.glob("step_*.bin"))}
    entries = canonical_curve(read_entries(run / ".loss.json"))
    return bins, [(e.step, e.loss, e.arm, e.phase) for e in entries]


class _Run:
    """A short run under a proxy that pauses after `stages`, pivoted by clients the test kills."""

    def __init__(self, run: Path, cache: Path, stages: tuple[str, ...]) -> None:
        run.mkdir()
        # Checkpoints written by the training thread: the stop below lands next to them.
        (run / "run.toml").write_text("[checkpoint]\nasync_write = false\n")
        self.run = run
        pause = ",".join(f"{s}={PAUSE_S}" for s in stages)
        self.proxy = proxy(run, env={"ANDREA_PIVOT_PAUSE": pause} if pause else None)
        self.trainer = Daemon(
            trainer_cmd(run, cache, "--mixing", "proxy", "--max-steps", str(STEPS))
            + ["--checkpoint-every", str(EVERY)]
        )
        self.clients: list[subprocess.Popen] = []

    def stopped_after(self, step: int) -> None:
        """The trainer, stopped just after its checkpoint of `step`."""
        self.trainer.wait_for(rf"checkpoint step_{step:06d}\.bin written", timeout=WAIT)
        self.trainer.signal(signal.SIGSTOP)

    def client(self, text: str) -> subprocess.Popen:
        policy = self.run.parent / f"{self.run.name}-{len(self.clients)}.toml"
        policy.write_text(text)
        client = ctl_bg(self.run, "pivot", "--policy", str(policy))
        self.clients.append(client)
        return client

    def pivot(self, text: str, kill_after: str | None) -> Callable[[], None]:
        """A pivot whose client is killed after the proxy's stage `kill_after` (None: never); the
        check of the client's exit, to call once the trainer is stopped again (a client that
        waits for its answer may exit after the released trainer passed the next checkpoint)."""
        client = self.client(text)
        if kill_after == "accepted":
            self.proxy.wait_for(r"pausing .* after stage accepted", timeout=WAIT)
            os.kill(client.pid, signal.SIGKILL)
        self.proxy.wait_for(r"asked the trainer to hold", timeout=WAIT)
        self.trainer.signal(signal.SIGCONT)
        if kill_after not in (None, "accepted"):
            self.proxy.wait_for(rf"pausing .* after stage {kill_after}", timeout=WAIT)
            os.kill(client.pid, signal.SIGKILL)

        def exited() -> None:
            code = client.wait(timeout=WAIT)
            assert code == (0 if kill_after is None else -signal.SIGKILL), (kill_after, code)

        return exited

    def done(self) -> None:
        """The proxy has finished the pivot (its answer, if any, went nowhere)."""
        self.proxy.wait_for(r"pivot: done", timeout=WAIT)

    def finish(self) -> Outcome:
        self.done()
        for client in self.clients:
            for pipe in (client.stdout, client.stderr):
                if pipe is not None:
                    pipe.close()
        assert self.trainer.wait(timeout=WAIT) == ExitCode.OK, self.trainer.log
        assert stop(self.proxy) == ExitCode.OK, self.proxy.log
        assert len(list((self.run / "archive").iterdir())) == len(BOUNDARIES)
        return _outcome(self.run)


def _pivoted(run: _Run, moments: tuple[str | None, ...]) -> Outcome:
    """The run's four pivots, each client killed after its moment (None: never)."""
    exited: Callable[[], None] | None = None
    for boundary, policy, moment in zip(BOUNDARIES, POLICIES, moments):
        if exited is not None:
            run.stopped_after(boundary - EVERY)
            exited()
            run.done()  # the proxy may still pause after the last one's release
        exited = run.pivot(policy, moment)
        if moment == "accepted":
            assert run.proxy.log.count("pivot: accepted") == 1, "the killed request pivoted"
    assert exited is not None
    exited()
    return run.finish()


def test_killed_at_five_moments_ends_as_the_pivots_done_whole(
    tmp_path: Path, cache_dir: Path
) -> None:
    # The reference: the four pivots done whole, their clients waiting for the answer.
    whole = _Run(tmp_path / "whole", cache_dir, ())
    whole.stopped_after(EVERY)
    reference = _pivoted(whole, (None,) * len(BOUNDARIES))
    curve = reference[1]
    assert [s for s, *_ in curve] == list(range(1, STEPS + 1))
    made = sorted(
        json.loads(f.read_text())["boundary_step"] for f in whole.run.glob("archive/*/pivot.json")
    )
    assert all(ph == sum(s > b for b in BOUNDARIES) for s, _, _, ph in curve), (made, curve)
    for first, second in (BOUNDARIES[:2], BOUNDARIES[2:]):
        assert {arm for s, _, arm, _ in curve if first < s <= second} == {"docstrings"}

    killed = _Run(tmp_path / "killed", cache_dir, MOMENTS)
    killed.stopped_after(EVERY)
    # Killed before its request reached the proxy: no pivot is started, nothing is held.
    early = killed.client(POLICY)
    os.kill(early.pid, signal.SIGKILL)
    assert early.wait(timeout=WAIT) == -signal.SIGKILL
    # Then one pivot a moment: taken by the proxy, the trainer not yet asked to hold; the
    # trainer holding, nothing committed; after the commit, before the release; after the
    # release, before the answer.
    assert _pivoted(killed, MOMENTS) == reference
