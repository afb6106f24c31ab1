"""TensorBoard event files of a run: written live by the proxy (``[metrics] tensorboard = true``) and
rebuilt from ``.loss.json`` by ``andreactl metrics export --format tensorboard``.

Written with tensorboardX's event-file writer: it needs only protobuf and numpy, where the
``tensorboard`` package (whose reader the tests use) pulls a web server and gRPC into the daemon.
One event per step carries every scalar of that step.

Tags (:data:`TAGS`; the arm tags are per arm)::

    loss/train  loss/ema  optim/lr  throughput/tokens_per_second  mixing/phase  run/segment
    loss/arm/ARM             the loss of each step trained on ARM (at those steps only)
    loss/arm_ema/ARM         ARM's loss EMA over ARM's steps only (series.arm_loss_ema)
    mixing/probability/ARM   live only: the bandit's probability of ARM after the step
    mixing/reward/ARM        live only: the bandit's reward of ARM after the step (docs/bandit.md)
    mixing/share/ARM         export only: ARM's share of the last N steps (the probabilities and
                             rewards are the bandit's internal state, which .loss.json does not record)
    eval/arm/ARM  eval/mean  the held-out loss of ARM and the mean over the arms at each evaluation
                             of .eval.json (the export: its canonical entries), at the evaluated step

A trainer restart re-trains the steps after its checkpoint: the live writer then writes a session
start at the first re-trained step, which tells TensorBoard to drop the superseded points, so the
curve it shows is the canonical one.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from andrea.daemon.metrics.series import (
    arm_loss_ema,
    default_window,
    ema_update,
    loss_ema,
    rolling_share,
    tokens_per_second,
)
from andrea.daemon.rundir.losslog import LossCurve
from andrea.protocol.evalentry import EvalEntry
from andrea.protocol.lossentry import LossEntry

TAGS = {
    "loss": "loss/train",
    "ema": "loss/ema",
    "lr": "optim/lr",
    "tokens_per_second": "throughput/tokens_per_second",
    "phase": "mixing/phase",
    "segment": "run/segment",
}
ARM_LOSS_TAG = "loss/arm/{arm}"
ARM_EMA_TAG = "loss/arm_ema/{arm}"
PROBABILITY_TAG = "mixing/probability/{arm}"
REWARD_TAG = "mixing/reward/{arm}"
SHARE_TAG = "mixing/share/{arm}"
EVAL_ARM_TAG = "eval/arm/{arm}"
EVAL_MEAN_TAG = "eval/mean"


class EventWriter:
    """Scalars per step into a new event file under ``logdir`` (created if needed).

    Synchronous: an event is a few hundred bytes appended to a buffered file, cheaper than the
    queue and thread of tensorboardX's own asynchronous writer; :meth:`flush` makes them visible.
    """

    def __init__(self, logdir: Path) -> None:
        # Imported here: only runs that ask for TensorBoard need tensorboardX installed.
        try:
            from tensorboardX.event_file_writer import EventsWriter
            from tensorboardX.proto import event_pb2, summary_pb2
        except ImportError as e:
            # A ValueError is a configuration error to the daemons: reported, not restarted.
            raise ValueError(
                f"TensorBoard event files need tensorboardX ({e}); install the extra with "
                "pip install 'andrea[tensorboard]' or set [metrics] tensorboard = false"
            ) from None

        logdir.mkdir(parents=True, exist_ok=True)
        self._event, self._summary, self._session = (
            event_pb2.Event,
            summary_pb2.Summary,
            event_pb2.SessionLog,
        )
        # The file name holds the time in whole seconds: the pid keeps two writers apart.
        self._writer = EventsWriter(str(logdir / "events"), filename_suffix=f".{os.getpid()}")

    def write_step(self, step: int, wall_time: float, scalars: Mapping[str, float]) -> None:
        """One event at ``step`` holding every scalar of ``scalars`` (tag -> value)."""
        values = [self._summary.Value(tag=t, simple_value=float(v)) for t, v in scalars.items()]
        self._writer.write_event(
            self._event(wall_time=wall_time, step=step, summary=self._summary(value=values))
        )

    def restart_at(self, step: int, wall_time: float) -> None:
        """Tell TensorBoard that points at ``step`` and later written before are superseded."""
        self._writer.write_event(
            self._event(
                wall_time=wall_time,
                step=step,
                session_log=self._session(status=self._session.START),
            )
        )

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def curve_scalars(curve: LossCurve, arms: list[str] | None = None) -> Iterator[dict[str, float]]:
    """The export's scalars of each row of ``curve`` (tag -> value), in row order."""
    ema = loss_ema(curve.loss)
    arm_ema = arm_loss_ema(curve.loss, curve.arm).tolist()
    tps = tokens_per_second(curve.tokens, curve.wall_time, curve.segment)
    names = arms if arms is not None else sorted(np.unique(curve.arm).tolist())
    shares = rolling_share(curve.arm, names, default_window(len(curve)))
    trained, losses = curve.arm.tolist(), curve.loss.tolist()
    columns = {
        TAGS["loss"]: curve.loss.tolist(),
        TAGS["ema"]: ema.tolist(),
        TAGS["lr"]: curve.lr.tolist(),
        TAGS["tokens_per_second"]: tps.tolist(),
        TAGS["phase"]: curve.phase.tolist(),
        TAGS["segment"]: curve.segment.tolist(),
        **{SHARE_TAG.format(arm=n): shares[n].tolist() for n in names},
    }
    for i in range(len(curve)):
        # A missing rate (first step of a segment) or EMA (before the first finite loss) is left out
        # rather than written as NaN, which TensorBoard would draw as a real point.
        row = {
            tag: v[i] for tag, v in columns.items() if tag == TAGS["loss"] or not math.isnan(v[i])
        }
        row[ARM_LOSS_TAG.format(arm=trained[i])] = losses[i]
        if not math.isnan(arm_ema[i]):
            row[ARM_EMA_TAG.format(arm=trained[i])] = arm_ema[i]
        yield row


def eval_scalars(e: EvalEntry) -> dict[str, float]:
    """The scalars of one held-out evaluation (tag -> value): each arm's loss and their mean."""
    return {
        **{EVAL_ARM_TAG.format(arm=name): a.loss for name, a in e.arms.items()},
        EVAL_MEAN_TAG: e.mean_loss(),
    }


def _events(
    curve: LossCurve, evals: Sequence[EvalEntry]
) -> Iterator[tuple[int, float, dict[str, float]]]:
    """(step, wall time, scalars) of every event of the export, in step order: a step's
    evaluation goes with its loss in one event; one of a step without a loss has its own."""
    steps, walls = curve.step.tolist(), curve.wall_time.tolist()
    pending = sorted(evals, key=lambda e: e.step)
    j = 0
    for i, scalars in enumerate(curve_scalars(curve)):
        while j < len(pending) and pending[j].step < steps[i]:
            yield pending[j].step, pending[j].wall_time, eval_scalars(pending[j])
            j += 1
        if j < len(pending) and pending[j].step == steps[i]:
            scalars.update(eval_scalars(pending[j]))
            j += 1
        yield steps[i], walls[i], scalars
    for e in pending[j:]:
        yield e.step, e.wall_time, eval_scalars(e)


def export_tensorboard(
    curve: LossCurve,
    logdir: Path,
    progress: Callable[[int, int], None] | None = None,
    evals: Sequence[EvalEntry] = (),
) -> int:
    """Write the canonical ``curve``, with the canonical held-out evaluations ``evals`` (one per
    step, as ``evallog.canonical_evals`` gives them), as one event file under ``logdir``; returns
    the steps of ``curve`` written."""
    writer = EventWriter(logdir)
    # Events: one per step, and one per evaluation of a step without a loss.
    total = len(curve) + len({e.step for e in evals}.difference(curve.step.tolist()))
    every = max(1, total // 10)
    try:
        for i, (step, wall, scalars) in enumerate(_events(curve, evals)):
            writer.write_step(step, wall, scalars)
            if progress is not None and (i + 1) % every == 0:
                progress(i + 1, total)
    finally:
        writer.close()
    return len(curve)


class LiveBoard:
    """The proxy's live TensorBoard: one event per newly logged step, the EMA following the canonical
    curve across restarts (the same values the export rebuilds)."""

    def __init__(self, logdir: Path, canonical: list[LossEntry]) -> None:
        self._writer = EventWriter(logdir)
        self._loss = {e.step: (e.loss, e.arm) for e in canonical}
        self._last_step = canonical[-1].step if canonical else 0
        self._newest = {e.segment: e.step for e in canonical}  # highest step seen per segment
        self._previous: tuple[int, float] | None = (
            (canonical[-1].segment, canonical[-1].wall_time) if canonical else None
        )
        self._ema, self._arm_ema = self._emas_before(self._last_step + 1)

    def _emas_before(self, step: int) -> tuple[float | None, dict[str, float | None]]:
        """The loss EMA and each arm's, over the canonical steps before `step`."""
        ema: float | None = None
        per_arm: dict[str, float | None] = {}
        for s in sorted(k for k in self._loss if k < step):
            loss, arm = self._loss[s]
            ema = ema_update(ema, loss)
            per_arm[arm] = ema_update(per_arm.get(arm), loss)
        return ema, per_arm

    def log(
        self,
        entries: list[LossEntry],
        probabilities: Mapping[str, float],
        rewards: Mapping[str, float] | None = None,
    ) -> None:
        """Write the entries not written before (a re-sent entry is skipped); the bandit's
        ``probabilities`` and ``rewards`` go with the last one."""
        fresh = [e for e in entries if e.step > self._newest.get(e.segment, 0)]
        for i, e in enumerate(fresh):
            if e.step <= self._last_step:
                # A restart re-trains from here: TensorBoard drops the superseded points.
                self._writer.restart_at(e.step, e.wall_time)
                self._ema, self._arm_ema = self._emas_before(e.step)
            self._newest[e.segment] = e.step
            self._loss[e.step] = (e.loss, e.arm)
            self._last_step = e.step
            self._ema = ema_update(self._ema, e.loss)
            arm_ema = self._arm_ema[e.arm] = ema_update(self._arm_ema.get(e.arm), e.loss)
            scalars = {
                TAGS["loss"]: e.loss,
                TAGS["lr"]: e.lr,
                TAGS["phase"]: e.phase,
                TAGS["segment"]: e.segment,
                ARM_LOSS_TAG.format(arm=e.arm): e.loss,
            }
            if self._ema is not None:
                scalars[TAGS["ema"]] = self._ema
            if arm_ema is not None:
                scalars[ARM_EMA_TAG.format(arm=e.arm)] = arm_ema
            prev = self._previous
            if prev is not None and prev[0] == e.segment and e.wall_time > prev[1]:
                scalars[TAGS["tokens_per_second"]] = e.tokens / (e.wall_time - prev[1])
            self._previous = (e.segment, e.wall_time)
            if i == len(fresh) - 1:
                for arm, p in probabilities.items():
                    scalars[PROBABILITY_TAG.format(arm=arm)] = p
                for arm, r in (rewards or {}).items():
                    scalars[REWARD_TAG.format(arm=arm)] = r
            self._writer.write_step(e.step, e.wall_time, scalars)
        if fresh:
            self._writer.flush()

    def log_eval(self, e: EvalEntry) -> None:
        """Write a held-out evaluation at the evaluated step (the export's tags); a restart's
        session start drops it with the steps it supersedes, as it does the losses."""
        self._writer.write_step(e.step, e.wall_time, eval_scalars(e))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
