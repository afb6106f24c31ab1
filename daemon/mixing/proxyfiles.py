"""The proxy's own files in the run directory: `.state.json` and `.samples.json`.

Their models, how they are read (a regular file of bounded size; a damaged one is moved aside,
never deleted) and written (atomically). `.loss.json` and `.eval.json` belong to
`daemon/rundir/losslog.py` and `daemon/rundir/evallog.py`; the archives of ended phases to `archive.py`.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from andrea.daemon.mixing.bandit import BanditState, PhaseCounters
from andrea.daemon.mixing.peers import TrainerLife
from andrea.daemon.rundir.boundedio import read_bounded
from andrea.daemon.rundir.durable import atomic_write_bytes
from andrea.daemon.rundir.layout import LOSS_FILE, SAMPLES_FILE, STATE_FILE, corrupt_name
from andrea.daemon.runtime.validation_messages import first_problem
from andrea.protocol import messages
from andrea.protocol.status import RewardReport, Zombie

log = logging.getLogger(__name__)

SAMPLES_KEPT = 20
#: What these files can hold (a few hundred arms of state; 1,000 records of 64 samples of at most
#: 17 KiB): a larger file is refused before it is read.
MAX_STATE_BYTES = 16 << 20
MAX_SAMPLES_BYTES = 64 << 20


class ProxyState(BaseModel):
    """`.state.json`. `bandit` is the bandit as of step `bandit.last_step`, deliberately at least
    W - 1 steps behind `durable_step` so that a restarted proxy can recompute every assignment it
    may still owe; the `live_*` fields describe the bandit at the moment of writing, for people."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["andrea-proxy-state/1"] = "andrea-proxy-state/1"
    written_utc: str
    durable_step: int = Field(ge=0, description="every loss up to here is in .loss.json")
    max_segment: int = Field(ge=0)
    bandit: BanditState
    live_counters: PhaseCounters
    live_probabilities: dict[str, float]
    zombies: list[Zombie]
    live_reward: RewardReport | None = None  # absent from states written before the reward choice
    trainer: TrainerLife | None = Field(
        None, description="the trainer life the proxy serves (absent before any hello)"
    )


class SampleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    step: int
    segment: int
    phase: int
    received_utc: str
    arm_mix: dict[str, int] = Field(description="steps per arm since the previous sample")
    samples: list[messages.Sample]

    @classmethod
    def received(cls, msg: messages.SampleReport, arm_mix: dict[str, int]) -> SampleRecord:
        """The record of a sample report received now."""
        return cls(
            step=msg.step,
            segment=msg.segment,
            phase=msg.phase,
            received_utc=now_utc(),
            arm_mix=arm_mix,
            samples=msg.samples,
        )


class SamplesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["andrea-samples/1"] = "andrea-samples/1"
    kept: int = Field(ge=1, le=1000)
    records: list[SampleRecord] = Field(max_length=1000)

    def holds(self, step: int, segment: int) -> bool:
        """Whether the samples of this step of this segment are kept already (a re-sent report)."""
        return any(r.step == step and r.segment == segment for r in self.records)

    def keep(self, rec: SampleRecord) -> None:
        """Add a record; only the newest `kept` stay."""
        self.records = (self.records + [rec])[-self.kept :]

    def write(self, path: Path) -> None:
        atomic_write_bytes(path, self.model_dump_json(indent=1).encode())


def empty_samples() -> SamplesFile:
    return SamplesFile(kept=SAMPLES_KEPT, records=[])


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def write_state_file(run_dir: Path, state: ProxyState) -> None:
    atomic_write_bytes(run_dir / STATE_FILE, state.model_dump_json(indent=1).encode())


def parse_state_file(path: Path) -> ProxyState:
    """Read `.state.json` (a regular file of bounded size); raises ValueError naming the first
    problem."""
    try:
        return ProxyState.model_validate_json(read_bounded(path, MAX_STATE_BYTES))
    except OSError as e:
        raise ValueError(f"{path.name}: cannot be read ({e.strerror or e})") from None
    except ValidationError as e:
        raise ValueError(f"{path.name}: not a valid proxy state ({first_problem(e)})") from None


def check_state(state: ProxyState, seed: int, logged_up_to: int) -> None:
    """A state file that contradicts the run's config or its log is damaged (moved aside, and
    the bandit rebuilt from the log, which is the ground truth)."""
    if state.bandit.seed != seed:
        raise ValueError(
            f"{STATE_FILE}: bandit seed {state.bandit.seed} is not run.toml's seed {seed}"
        )
    if state.durable_step > logged_up_to:
        raise ValueError(
            f"{STATE_FILE}: says every loss up to step {state.durable_step} is logged, but"
            f" {LOSS_FILE} ends at step {logged_up_to}"
        )


def move_aside(path: Path) -> Path:
    """Rename a damaged file to its `.corrupt-<time>` name (kept for a person to look at)."""
    bad = path.with_name(corrupt_name(path.name, int(time.time())))
    path.rename(bad)
    return bad


def load_samples(run_dir: Path) -> SamplesFile:
    """`.samples.json`, or a new empty one (a damaged file is moved aside)."""
    path = run_dir / SAMPLES_FILE
    if path.exists():
        try:
            return SamplesFile.model_validate_json(read_bounded(path, MAX_SAMPLES_BYTES))
        except (ValidationError, ValueError, OSError) as e:
            why = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
            bad = move_aside(path)
            log.warning(
                "%s is not valid (%s); moved to %s, starting a new one",
                path.name,
                why,
                bad.name,
            )
    return empty_samples()
