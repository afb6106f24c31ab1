"""How the entry point configures one Trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from andrea.daemon.config import RunConfig
from andrea.daemon.trainer.platform import distributed as dist


@dataclass
class TrainerOptions:
    run_dir: Path
    cfg: RunConfig
    allow_config_change: bool = False
    #: Deliberately broken resumes, for the negative controls only: "rng", "cursor", and "buckets"
    #: (DDP's first step in its first-iteration bucket layout, `parts.finalize_ddp_buckets` skipped).
    skip_restore: frozenset[str] = field(default_factory=frozenset)
    #: This process's place in a torchrun job (a world of one by default).
    world: dist.World = field(default_factory=dist.World)
    #: False only to measure what the per-step agreement costs (tests/bench/bench_distributed.py).
    coordinate: bool = True
    #: Changes to the run's config accepted with --allow-config-change, recorded in its resolved
    #: config once the resume is accepted and before the proxy is told (it re-reads the record
    #: on a changed seed).
    config_changes: list[str] = field(default_factory=list)
    #: The person's config file the start read (--config, else run.toml): the record takes it in.
    user_config: Path | None = None
    #: A new run starts from this checkpoint of another run (--init-from): its weights, and with
    #: `init_optimizer` Adam's moments and step count.
    init_from: Path | None = None
    init_optimizer: bool = False
