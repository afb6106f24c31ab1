"""What rank 0 tells people while it trains: the progress line and systemd's status line, the
Prometheus exposition, the wait for the proxy, the run summary, and the throughput, ETA and
checkpoint age that status shows. The ranks other than 0 report only how they stopped."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import torch

from andrea.daemon.metrics.prometheus import Exposition, exposition_for
from andrea.daemon.runtime.operator_requests import StopReason
from andrea.daemon.runtime.progress import RunSummary, eta_seconds, format_duration, journal_fields
from andrea.daemon.trainer import schedule
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.sink import RecordSink
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.status import Activity

log = logging.getLogger(__name__)


class Reporter:
    """Progress as of the last progress line: tokens/s and s/step are measured over the window
    since the previous line (evaluation and samples excluded)."""

    def __init__(self, ctx: TrainerContext, sink: RecordSink) -> None:
        """Built once the life is resumed: its baseline is where the resume left the counters.
        `sink`: where the records go (the link's lag is a metric)."""
        self.ctx = ctx
        self.main = ctx.main
        self.sink = sink
        c = ctx.counters
        # (step, monotonic time, tokens) when this life started: the summary's and ETA's baseline.
        self._started = (c.step, time.monotonic(), c.tokens_seen)
        #: Rank 0's metrics exposition, when configured.
        self.prometheus: Exposition | None = (
            exposition_for(ctx.cfg.metrics, "trainer", ctx.run_dir) if self.main else None
        )
        # The progress line's window: since when, how many tokens and steps.
        self._window_start = time.perf_counter()
        self._window_tokens = 0
        self._window_steps = 0
        self._wait_since: float | None = None
        self._next_report = 0.0

    def describe_start(self) -> None:
        """Rank 0's lines about the schedule, the model and the job it starts."""
        if not self.main:
            return
        cfg, platform, parts = self.ctx.cfg, self.ctx.platform, self.ctx.parts
        log.info("%s", schedule.describe(cfg.optim))
        if (why := schedule.disagreement(cfg.optim, cfg.max_steps)) is not None:
            log.warning("%s", why)
        log.info(
            "model %s: %s parameters on %s, %s, %d threads%s%s; %s mixing; world size %d; "
            "starting at step %d",
            cfg.preset,
            f"{parts.model.n_params():,}",
            platform.device,
            platform.numerics.recorded,
            torch.get_num_threads(),
            ", deterministic" if platform.deterministic else "",
            ", activation recompute per block" if cfg.model.recompute == "blocks" else "",
            cfg.mixing,
            self.ctx.world.size,
            self.ctx.counters.step,
        )
        log.info("%s", parts.batch.describe())

    # ---- the progress line --------------------------------------------------------------------

    def restart_window(self) -> None:
        """Measure the training speed from now on."""
        self._window_start = time.perf_counter()
        self._window_tokens = self._window_steps = 0

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """The time spent in the body does not count towards the training speed."""
        t0 = time.perf_counter()
        yield
        self._window_start += time.perf_counter() - t0

    def step_done(self, entry: LossEntry) -> None:
        """Rank 0, once a step's record is taken: the watchdog, and every `log_every` steps (and
        at the last) the progress line, systemd's status line and the metrics."""
        self.ctx.notifier.tick()
        self._window_tokens += entry.tokens
        self._window_steps += 1
        c, cfg = self.ctx.counters, self.ctx.cfg
        # The record may come a step late (loop.py): its own step decides, not the counter.
        step = entry.step
        if step % cfg.log_every != 0 and step != cfg.max_steps:
            return
        elapsed = time.perf_counter() - self._window_start
        c.tokens_per_second = self._window_tokens / elapsed
        c.seconds_per_step = elapsed / self._window_steps
        c.lr = entry.lr
        eta = format_duration(eta_seconds(step, cfg.max_steps, c.seconds_per_step))
        ema = float("nan") if c.loss_ema is None else c.loss_ema
        log.info(
            "step %d/%d | loss %.4f (ema %.4f) | lr %.2e | %s | %.0f tok/s | %.1f ms/step"
            " | ETA %s | last ckpt %s",
            step,
            cfg.max_steps,
            entry.loss,
            ema,
            entry.lr,
            entry.arm,
            c.tokens_per_second,
            1000 * c.seconds_per_step,
            eta,
            c.last_saved or "none",
            extra=journal_fields(step, entry.loss, entry.lr, entry.arm, entry.phase),
        )
        self.ctx.notifier.status(f"step {step}/{cfg.max_steps} loss {ema:.4f} ETA {eta}")
        self.publish_metrics()
        self.restart_window()

    # ---- waiting for the proxy ----------------------------------------------------------------

    def waiting_for_proxy(self, step: int) -> None:
        """Rank 0, while no rank can train `step` because the proxy has not assigned it."""
        if not self.main:
            return
        now = time.monotonic()
        if self._wait_since is None:
            self._wait_since, self._next_report = now, now + 2.0
        self.ctx.counters.activity = Activity.WAITING_FOR_PROXY
        if now >= self._next_report:
            waited = now - self._wait_since
            log.warning("waiting for the proxy to assign step %d (%.0f s so far)", step, waited)
            self.ctx.notifier.status(
                f"step {self.ctx.counters.step}: waiting for proxy ({waited:.0f} s)"
            )
            self._next_report += 10.0
        self.ctx.notifier.tick()

    def waiting_over(self) -> None:
        """The next wait for the proxy is a new one (it reports from its own start)."""
        self._wait_since = None

    # ---- metrics, status, summary -------------------------------------------------------------

    def publish_metrics(self, force: bool = False) -> None:
        if self.prometheus is None:
            return
        c = self.ctx.counters
        holding = c.activity in (Activity.HOLDING, Activity.WAITING_FOR_PROXY)
        self.prometheus.set(
            {
                "andrea_step": c.step,
                "andrea_max_steps": self.ctx.cfg.max_steps,
                "andrea_loss_ema": c.loss_ema,
                "andrea_tokens_per_second": c.tokens_per_second,
                "andrea_learning_rate": c.lr,
                "andrea_checkpoint_age_seconds": (
                    None if c.last_saved_at is None else time.time() - c.last_saved_at
                ),
                "andrea_holding": int(holding),
                "andrea_proxy_link_lag_steps": self.sink.lag_steps(),
                "andrea_segment": c.segment or None,
            }
        )
        self.prometheus.publish(force)

    def progress_status(self) -> dict[str, float | None]:
        """Throughput, LR, elapsed time, ETA and checkpoint age, as of the last progress line."""
        c = self.ctx.counters
        spp = c.seconds_per_step
        return {
            "tokens_per_second": c.tokens_per_second,
            "lr": c.lr,
            "elapsed_seconds": time.monotonic() - self._started[1],
            "eta_seconds": None
            if spp is None
            else eta_seconds(c.step, self.ctx.cfg.max_steps, spp),
            "last_checkpoint_age_seconds": None
            if c.last_saved_at is None
            else time.time() - c.last_saved_at,
        }

    def summary(self, reason: StopReason | None) -> None:
        """How this life ended: rank 0's run summary (and a last metrics update), the other
        ranks' one line."""
        c = self.ctx.counters
        if not self.main:
            log.info("stopped at step %d (%s)", c.step, reason or "max_steps reached")
            return
        first, started, tokens = self._started
        log.info(
            "%s",
            RunSummary(
                first_step=first,
                last_step=c.step,
                wall_seconds=time.monotonic() - started,
                tokens=c.tokens_seen - tokens,
                loss_ema=c.loss_ema,
                checkpoints_written=c.checkpoints_written,
                segment=c.segment,
                stopped_because=f"stopped at step {c.step} ({reason or 'max_steps reached'})",
            ).text(),
        )
        self.publish_metrics(force=True)
