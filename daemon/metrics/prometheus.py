"""Prometheus exposition of a daemon's state, with prometheus-client: a textfile for node_exporter's
textfile collector, or an HTTP endpoint (bound to 127.0.0.1 unless the config says otherwise).

Each daemon exposes what it knows, every metric labelled ``run`` (the run directory's name):

======================================  =======  ==================================================
metric                                  daemon   meaning
======================================  =======  ==================================================
andrea_step                             trainer  optimizer updates done
andrea_max_steps                        trainer  the run's target
andrea_loss_ema                         trainer  loss EMA (series.EMA_WEIGHT)
andrea_tokens_per_second                trainer  over the last progress window
andrea_learning_rate                    trainer  of the last step
andrea_checkpoint_age_seconds           trainer  since the newest durable checkpoint was written
andrea_holding                          trainer  1 while held at a boundary checkpoint or waiting
                                                 for the proxy, else 0
andrea_proxy_link_lag_steps             trainer  trained steps the proxy has not acknowledged yet
andrea_segment                          trainer  the segment the trainer trains
andrea_phase                            proxy    bandit phase (pivot counter)
andrea_logged_step                      proxy    every step up to here is durable in .loss.json
andrea_zombie_arms                      proxy    arms whose source is gone
andrea_arm_probability{arm}             proxy    the bandit's current probability of each arm
======================================  =======  ==================================================

The textfile is replaced atomically (prometheus-client writes a temporary and renames it), so the
collector never reads half a file.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server, write_to_textfile

from andrea.daemon.config import MetricsConfig

log = logging.getLogger(__name__)

TRAINER_GAUGES = {
    "andrea_step": "optimizer updates done",
    "andrea_max_steps": "the run's max_steps",
    "andrea_loss_ema": "loss EMA of the training loss",
    "andrea_tokens_per_second": "training throughput over the last progress window",
    "andrea_learning_rate": "learning rate of the last step",
    "andrea_checkpoint_age_seconds": "seconds since the newest durable checkpoint was written",
    "andrea_holding": "1 while the trainer holds (boundary checkpoint, waiting for the proxy)",
    "andrea_proxy_link_lag_steps": "trained steps whose loss the proxy has not acknowledged",
    "andrea_segment": "the segment number: the numbered stretch of records the trainer trains",
}
PROXY_GAUGES = {
    "andrea_phase": "bandit phase (pivot counter)",
    "andrea_logged_step": "every step up to this one is durable in .loss.json",
    "andrea_zombie_arms": "arms whose data source is gone (they never draw)",
}
ARM_PROBABILITY = "andrea_arm_probability"
#: The textfile is rewritten at most this often (seconds), except when forced (start, stop).
PUBLISH_EVERY = 5.0


class Exposition:
    """The gauges of one daemon (``role`` "trainer" or "proxy") of the run ``run``."""

    def __init__(self, role: str, run: str) -> None:
        self.registry = CollectorRegistry()
        self.run = run
        names = TRAINER_GAUGES if role == "trainer" else PROXY_GAUGES
        self._gauges = {
            name: Gauge(name, doc, ["run"], registry=self.registry) for name, doc in names.items()
        }
        self._arms = (
            Gauge(
                ARM_PROBABILITY,
                "the bandit's current probability of each arm",
                ["run", "arm"],
                registry=self.registry,
            )
            if role == "proxy"
            else None
        )
        self._textfile: Path | None = None
        self._published = 0.0

    def set(self, values: Mapping[str, float | None]) -> None:
        """Set the named gauges; a None value (not known yet) leaves the gauge as it was."""
        for name, value in values.items():
            if value is not None:
                self._gauges[name].labels(run=self.run).set(value)

    def set_arm_probabilities(self, probabilities: Mapping[str, float]) -> None:
        assert self._arms is not None, "arm probabilities are the proxy's"
        for arm, p in probabilities.items():
            self._arms.labels(run=self.run, arm=arm).set(p)

    def serve(self, address: str, port: int) -> None:
        """Serve ``/metrics`` on ``address:port`` from a daemon thread; a warning when others than
        this host can read it."""
        start_http_server(port, addr=address, registry=self.registry)
        log.info("Prometheus metrics on http://%s:%d/metrics", address, port)
        if (reach := beyond_localhost(address)) is not None:
            log.warning(
                "Prometheus metrics of this run are served on %s:%d, %s, without authentication;"
                ' set [metrics] prometheus_address = "127.0.0.1" (the default) unless that is'
                " intended",
                address,
                port,
                reach,
            )

    def write_to(self, textfile: Path) -> None:
        """Write the textfile at ``textfile`` now and on every :meth:`publish`."""
        self._textfile = textfile
        try:
            textfile.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            log.warning(
                "cannot create the Prometheus textfile directory %s: %s", textfile.parent, e
            )
        self.publish(force=True)

    def publish(self, force: bool = False) -> None:
        """Rewrite the textfile, if there is one and :data:`PUBLISH_EVERY` has passed or ``force``
        (the HTTP endpoint reads the gauges live)."""
        now = time.monotonic()
        if self._textfile is not None and (force or now - self._published >= PUBLISH_EVERY):
            self._published = now
            try:
                write_to_textfile(str(self._textfile), self.registry)
            except OSError as e:
                # Metrics must never stop training: report once per failure and carry on.
                log.warning("cannot write the Prometheus textfile %s: %s", self._textfile, e)


def exposition_for(cfg: MetricsConfig, role: str, run_dir: Path) -> Exposition | None:
    """The exposition ``cfg`` asks of the daemon ``role`` in ``run_dir``, started; None if none.

    A port already in use or an unwritable textfile directory is logged and skipped: metrics
    never stop a run.
    """
    if cfg.prometheus_port is None and cfg.prometheus_textfile_dir is None:
        return None
    run = run_dir.resolve().name
    ex = Exposition(role, run)
    if cfg.prometheus_port is not None:
        port = cfg.prometheus_port + (1 if role == "proxy" else 0)
        try:
            ex.serve(cfg.prometheus_address, port)
        except OSError as e:
            log.warning(
                "cannot serve Prometheus metrics on %s:%d: %s", cfg.prometheus_address, port, e
            )
    if cfg.prometheus_textfile_dir is not None:
        directory = run_dir / cfg.prometheus_textfile_dir  # an absolute path stays as it is
        ex.write_to(directory / textfile_name(role, run))
    return ex


def beyond_localhost(address: str) -> str | None:
    """Who besides this host can reach an endpoint bound to ``address``, in words; None when only
    this host can (a loopback address, or "localhost")."""
    if address == "localhost":
        return None
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"reachable by whoever reaches the host name {address!r}"
    if ip.is_loopback:
        return None
    if ip.is_unspecified:
        return "reachable from every network this host is on"
    return "reachable from the network of that address"


def textfile_name(role: str, run: str) -> str:
    """``andrea-ROLE-RUN.prom``: node_exporter reads every ``*.prom`` of its directory."""
    return f"andrea-{role}-{run}.prom"
