"""`andreactl pivot` killed (SIGKILL) at five moments of a pivot: the proxy runs the pivot, so the
client's death leaves nothing to clean up. Each run ends training on one consistent phase, with
the same checkpoints (byte for byte) and the same losses as the run whose pivots were done whole;
a client killed before its request reached the proxy pivots nothing.

Each run pivots twice, after steps 20 and 40 (two policies), its clients killed at two moments;
one reference run makes both pivots whole. The moments are made exact with the proxy's test-only
pauses (ANDREA_PIVOT_PAUSE, daemon/mixing/pivot_orchestrator.py): the proxy waits after a stage,
serving the trainer's link meanwhile, while the test kills the client. The trainer is stopped
(SIGSTOP) from a checkpoint until the proxy has asked it to hold, so that each pivot holds at the
next boundary, the same in every run."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from andrea.daemon.rundir.losslog import canonical_curve, read_entries
from andrea.daemon.runtime.exitcodes import ExitCode
from tests.support.daemons import Daemon, trainer_cmd
from tests.support.pivot import POLICY, ctl_bg, proxy, stop

EVERY = 10
#: The two pivots' boundaries; the trainer is stopped at the checkpoint before each.
FIRST, SECOND = 2 * EVERY, 4 * EVERY
STEPS = SECOND + EVERY
SECOND_POLICY = POLICY.replace("cap = 0.0", "cap = 0.5", 1)
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

    def pivot(self, text: str, kill_after: str | None) -> None:
        """A pivot whose client is killed after the proxy's stage `kill_after` (None: never)."""
        client = self.client(text)
        if kill_after == "accepted":
            self.proxy.wait_for(r"pausing .* after stage accepted", timeout=WAIT)
            os.kill(client.pid, signal.SIGKILL)
        self.proxy.wait_for(r"asked the trainer to hold", timeout=WAIT)
        self.trainer.signal(signal.SIGCONT)
        if kill_after not in (None, "accepted"):
            self.proxy.wait_for(rf"pausing .* after stage {kill_after}", timeout=WAIT)
            os.kill(client.pid, signal.SIGKILL)
        code = client.wait(timeout=WAIT)
        assert code == (0 if kill_after is None else -signal.SIGKILL), (kill_after, code)

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
        assert len(list((self.run / "archive").iterdir())) == 2
        return _outcome(self.run)


def _pivoted(run: _Run, first: str | None, second: str | None) -> Outcome:
    run.stopped_after(EVERY)
    run.pivot(POLICY, first)
    run.stopped_after(3 * EVERY)  # the proxy may still be pausing after the release
    run.done()
    run.pivot(SECOND_POLICY, second)
    return run.finish()


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Outcome:
    """The reference: both pivots done whole, their clients waiting for the answer."""
    run = _Run(tmp_path_factory.mktemp("reference") / "whole", cache_dir, ())
    out = _pivoted(run, None, None)
    curve = out[1]
    assert [s for s, *_ in curve] == list(range(1, STEPS + 1))
    assert all(ph == (s > FIRST) + (s > SECOND) for s, _, _, ph in curve), curve
    assert {arm for s, _, arm, _ in curve if FIRST < s <= SECOND} == {"docstrings"}
    return out


def test_killed_before_its_request_before_the_hold_and_during_it(
    tmp_path: Path, cache_dir: Path, whole: Outcome
) -> None:
    run = _Run(tmp_path / "run", cache_dir, ("accepted", "holding"))
    run.stopped_after(EVERY)
    # Killed before its request reached the proxy: no pivot is started, nothing is held.
    early = run.client(POLICY)
    os.kill(early.pid, signal.SIGKILL)
    assert early.wait(timeout=WAIT) == -signal.SIGKILL
    run.pivot(POLICY, "accepted")  # the proxy took it, the trainer not yet asked to hold
    assert run.proxy.log.count("pivot: accepted") == 1, "the killed request started a pivot"
    run.stopped_after(3 * EVERY)
    run.done()
    run.pivot(SECOND_POLICY, "holding")  # the trainer holds, nothing committed yet
    assert run.finish() == whole


def test_killed_after_the_commit_and_after_the_release(
    tmp_path: Path, cache_dir: Path, whole: Outcome
) -> None:
    # After the commit, before the release; then after the release, before the answer.
    run = _Run(tmp_path / "run", cache_dir, ("committed", "released"))
    assert _pivoted(run, "committed", "released") == whole
