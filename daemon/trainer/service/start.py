"""What a start of andrea-trainer settles before any process group or model exists.

The run directory and its config (preset ← run.toml ← flags), whether this is a new run or one
that resumes under changed settings, what this machine can run, and the options refused before
anything starts. Rank 0 alone writes the run directory; the other ranks read what it wrote
(atomically). A mistake is a `ConfigError` (or `OSError`) here, before the job's ranks have met:
torchrun's agent sees the rank fail and stops the others.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from andrea.daemon.checkpoint.manager import checkpoint_steps, read_manifest
from andrea.daemon.checkpoint.source import SourceError, read_source, shape_differences
from andrea.daemon.config import (
    ConfigError,
    RunConfig,
    build_config,
    config_changes,
    for_new_run,
    left_open,
    load_toml,
    read_record,
    record_resolved,
)
from andrea.daemon.data.batch_split import batch_shape
from andrea.daemon.data.open_settings import OpenSettings, resolve_open_settings
from andrea.daemon.data.sources import DataError, SourceRejected
from andrea.daemon.data.tokenizer import RunTokenizer, describe_identity
from andrea.daemon.rundir.layout import CONFIG_FILE, RESOLVED_CONFIG_FILE, bin_name
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.trainer.platform.world import World
from andrea.daemon.trainer.service.flags import config_overrides
from andrea.protocol.lineage import InitSource

if TYPE_CHECKING:
    import torch

log = logging.getLogger("andrea.trainer")


def data_refusal(e: DataError) -> tuple[ExitCode, str]:
    """The exit code and log line of a start whose data is refused: a file that is not a regular
    file's content (a FIFO, a file of /proc) is the config's mistake (2); missing or unusable
    data is 5. One mapping for the start and for `--check`."""
    if isinstance(e, SourceRejected):
        return ExitCode.CONFIG_ERROR, f"data: {e}"
    return ExitCode.DATA_ERROR, f"data: {e}"


class StartRefused(Exception):
    """The trainer cannot start on this run directory; the message says why, the code tells systemd."""

    def __init__(self, message: str, code: ExitCode, agreed: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        #: Every rank of a job refuses alike (so none waits in a collective any more).
        self.agreed = agreed


@dataclass(frozen=True)
class StartPlan:
    """What the start settled: everything the trainer is built from besides the command line."""

    run_dir: Path
    cfg: RunConfig
    device: torch.device
    #: Restores skipped on purpose (the negative controls of the resume proof).
    skip: frozenset[str]
    #: The run's config was lost beside checkpoints: it is recorded only once the resume is
    #: accepted.
    write_config_after_setup: bool = False
    #: Changes of the trajectory accepted with --allow-config-change, named.
    changes: list[str] = field(default_factory=list)
    #: A new run starts from this checkpoint of another run (--init-from).
    init_from: Path | None = None
    #: Which held-out case applies (new run, predates splits, set), for the start log.
    heldout: str = ""
    #: Settings a person's run.toml left open that this new run recorded, `key = value`.
    recorded: list[str] = field(default_factory=list)
    #: The person's config file this start read (--config, else run.toml), None without one.
    user_file: Path | None = None


def plan_start(args: argparse.Namespace, world: World, write: bool = True) -> StartPlan:
    """Resolve and check the run's config and record it (RESOLVED_CONFIG_FILE) when it is a new
    run (unless `write` is False: `--check` writes nothing). A person's run.toml is never
    rewritten.

    ConfigError (or OSError) for a mistake of the command line, the config or the run directory;
    StartRefused when the start would change an existing run's trajectory without
    --allow-config-change, or start one that has checkpoints over again (--init-from)."""
    run_dir: Path = args.run_dir
    # Whether this run already has its own config (read once: another rank of a job may write it
    # in the meantime), and checkpoints: only then can a config without a split predate splits.
    has_checkpoints = bool(_checkpoints(run_dir))
    run_toml_existed = (run_dir / CONFIG_FILE).exists() or (
        has_checkpoints and (run_dir / RESOLVED_CONFIG_FILE).exists()
    )
    predates = run_toml_existed and has_checkpoints
    settled = resolve_start(args, run_toml_existed, predates)
    cfg = settled.cfg
    batch_shape(cfg, world.size, has_checkpoints)
    init_from = _check_init_from(args, cfg, world, settled.tokenizer)
    check_proxy_options(args)
    skip = _unsafe_options(args, cfg)
    changes = _trajectory_changes(args, cfg, world, has_checkpoints, predates)
    # torch's import (1-3 s of CPU) waits until nothing the config, the flags or the run's record
    # can refuse: those refusals answer at once.
    device = _check_machine(cfg, world)
    # Only now, when nothing the command line says can be refused any more: a refused start
    # leaves no run directory behind.
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
    user_file = _user_file(args)
    recorded: list[str] = []
    own = run_dir / CONFIG_FILE
    if world.is_main and own.exists() and not has_checkpoints:
        recorded = left_open(load_toml(own), cfg)[1]
    write_later = _record(args, cfg, world, write, has_checkpoints)
    return StartPlan(
        run_dir,
        cfg,
        device,
        skip,
        write_later,
        changes,
        init_from,
        settled.heldout,
        recorded,
        user_file,
    )


def _user_file(args: argparse.Namespace) -> Path | None:
    """The config file a person gave this start: --config, else the run's run.toml, if any."""
    path: Path = args.config or (args.run_dir / CONFIG_FILE)
    return path if args.config or path.exists() else None


def resolve_config(
    args: argparse.Namespace, run_toml_existed: bool, predates_splits: bool | None = None
) -> RunConfig:
    """The run's config: the preset, then --config or the run's run.toml, then the flags; settled
    (`resolve_start`)."""
    return resolve_start(args, run_toml_existed, predates_splits).cfg


def resolve_start(
    args: argparse.Namespace, run_toml_existed: bool, predates_splits: bool | None = None
) -> OpenSettings:
    """`resolve_config`, and which held-out case applies. OpenSettings by daemon/data/open_settings.py: a new run's
    held-out split (a run predates splits only with checkpoints and its own run.toml: by default
    when `run_toml_existed` and the run directory has checkpoints), the tokenizer's vocabulary."""
    if predates_splits is None:
        predates_splits = run_toml_existed and bool(_checkpoints(args.run_dir))
    cfg_path = args.config or (args.run_dir / CONFIG_FILE)
    user_values = load_toml(cfg_path) if (args.config or cfg_path.exists()) else None
    file_values = user_values or {}
    # A run with checkpoints trains under its recorded config, with what the person's file
    # changed since (then named, and refused unless deliberate). Before the first checkpoint the
    # file and the flags alone decide: a record a refused first start left means nothing.
    record = read_record(args.run_dir) if _checkpoints(args.run_dir) else None
    if record is not None:
        file_values = record.with_edits(user_values, cfg_path)
    run_preset = file_values.get("preset")
    if args.preset and run_preset and args.preset != run_preset:
        raise ConfigError(
            f"--preset {args.preset} disagrees with this run's preset {run_preset} ({cfg_path}): "
            "a run keeps its model; drop --preset, or start a new run directory"
        )
    overrides = config_overrides(args)
    if args.with_proxy:
        overrides["mixing"] = "proxy"
    if "batch_size_per" not in file_values:
        # What batch_size counts belongs to the run, not to the file a start names: a new run
        # counts it per step; an existing one keeps what its run.toml says (a --config file
        # written for it need not repeat it).
        run_toml = args.run_dir / CONFIG_FILE
        if record is not None:
            recorded = record.values
        elif args.config and run_toml_existed and run_toml.exists():
            recorded = load_toml(run_toml)
        else:
            recorded = file_values
        if not run_toml_existed:
            file_values["batch_size_per"] = "step"
        elif "batch_size_per" in recorded:
            file_values["batch_size_per"] = recorded["batch_size_per"]
    cfg = build_config(file_values, overrides, source=str(cfg_path))
    # Without run.toml the flags describe a run as this version creates it: with the default
    # held-out split. A run that lost its run.toml is then resumed only if its checkpoints agree;
    # one older than splits is refused naming data.heldout_fraction, and --heldout-fraction 0
    # restores it. A run.toml of a new run (no checkpoint) gets the default split too.
    cfg = cfg if run_toml_existed else for_new_run(cfg)
    return resolve_open_settings(cfg, args.run_dir, predates_splits)


def _check_machine(cfg: RunConfig, world: World) -> torch.device:
    """This rank's device. A device or precision this machine cannot run is refused before
    run.toml records it."""
    from andrea.daemon.trainer.platform.distributed import device_for
    from andrea.daemon.trainer.platform.precision import resolve, resolve_device

    device = device_for(world, resolve_device(cfg.device))
    resolve(cfg.precision, device)
    return device


def _trajectory_changes(
    args: argparse.Namespace, cfg: RunConfig, world: World, has_checkpoints: bool, predates: bool
) -> list[str]:
    """The trajectory changes this start makes to the run its record (or, for a new run, its own
    run.toml) describes; StartRefused (exit 4) naming them unless --allow-config-change."""
    run_dir: Path = args.run_dir
    record = read_record(run_dir) if has_checkpoints else None
    run_toml = run_dir / CONFIG_FILE
    if not world.is_main or (record is None and not run_toml.exists()):
        return []
    # What this start's flags change in the trajectory its record describes, with the person's
    # edits in (those the checkpoint's own check names, arms explained); for a new run, what its
    # own run.toml states (a flag may set what it leaves open). Named, and refused unless
    # deliberate (then recorded once the resume has been accepted).
    if record is not None:
        user_file = _user_file(args)
        user_values = load_toml(user_file) if user_file is not None else None
        where = user_file or record.path
        values = record.with_edits(user_values, where)
    else:
        where, values = run_toml, left_open(load_toml(run_toml), cfg)[0]
    own = build_config(values, source=str(where))
    recorded = resolve_open_settings(own, run_dir, predates).cfg
    changes = config_changes(recorded.trajectory(), cfg.trajectory())
    if changes and not args.allow_config_change:
        raise StartRefused(
            f"this start changes the run's training config ({where}): "
            f"{'; '.join(changes)}; pass --allow-config-change to continue under the new one "
            "on purpose",
            ExitCode.RESUME_REFUSED,
        )
    return changes


def _record(
    args: argparse.Namespace, cfg: RunConfig, world: World, write: bool, has_checkpoints: bool
) -> bool:
    """Records a new run's config now (if `write`); whether to record it only after the resume
    (a run that has checkpoints but lost its config: recorded now, a refused resume would leave
    the defaults recorded for every restart)."""
    if write and world.is_main and not has_checkpoints:
        record_resolved(cfg, args.run_dir, _user_file(args))
    return world.is_main and has_checkpoints and read_record(args.run_dir) is None


def _checkpoints(run_dir: Path) -> list[int]:
    return checkpoint_steps(run_dir) if run_dir.is_dir() else []


def _check_init_from(
    args: argparse.Namespace, cfg: RunConfig, world: World, tokenizer: RunTokenizer
) -> Path | None:
    """The checkpoint a new run starts from (--init-from), checked before anything is written:
    an intact manifest of a model of the same shape and tokenizer (another one only with
    --init-from-other-tokenizer), into a directory without checkpoints. None
    without --init-from, and for a restart of the run that already started from it. Every rank
    that can see the source checks it, so that a refusal ends them all at once; a rank on another
    machine leaves it to rank 0."""
    for flag in ("init_from_optimizer", "init_from_other_tokenizer"):
        if getattr(args, flag) and args.init_from is None:
            raise ConfigError(
                f"--{flag.replace('_', '-')} goes with --init-from PATH/step_NNNNNN.bin"
            )
    if args.init_from is None:
        return None
    try:
        source = read_source(args.init_from)
    except SourceError as e:
        if world.is_main:
            raise ConfigError(str(e)) from None
        return args.init_from
    if diff := shape_differences(source.manifest.model, cfg.model):
        raise ConfigError(
            f"--init-from {source.path}: its model is not this run's shape ({'; '.join(diff)}, "
            "checkpoint → this run); a run starts from a checkpoint of the same shape"
        )
    _check_tokenizer(args, source.path, source.manifest.tokenizer, tokenizer, world)
    steps = _checkpoints(args.run_dir)
    if not steps:
        return source.path
    started = _started_from(args.run_dir, steps[0])
    if started is not None and started.bin_sha256 == source.manifest.bin_sha256:
        if world.is_main:
            log.info(
                "this run started from %s (sha256 %s…); resuming its own checkpoints",
                started.path,
                started.bin_sha256[:12],
            )
        return None
    raise StartRefused(
        f"--init-from starts a new run, and {args.run_dir} holds checkpoints (newest "
        f"{bin_name(steps[0])}) of a run that did not start from {source.path}: resume it "
        "without --init-from, or start the new run in a new directory",
        ExitCode.RESUME_REFUSED,
    )


def _check_tokenizer(
    args: argparse.Namespace, path: Path, source: str, tokenizer: RunTokenizer, world: World
) -> None:
    """Embedding rows stand for the tokens of the tokenizer they were trained under: a source of
    another tokenizer (even of the same size) is refused, naming both, unless the person says they
    mean it (vocabulary surgery)."""
    if source == tokenizer.identity:
        return
    what = (
        f"--init-from {path}: its model was trained under {describe_identity(source)}, this "
        f"run's [data] tokenizer is {tokenizer.describe(full=True)}"
    )
    if not args.init_from_other_tokenizer:
        raise ConfigError(
            f"{what}: each embedding row would stand for another token; start from a checkpoint "
            "of the same tokenizer, or pass --init-from-other-tokenizer to start from it on "
            "purpose (vocabulary surgery)"
        )
    if world.is_main:
        log.warning("%s; starting from it anyway (--init-from-other-tokenizer)", what)


def _started_from(run_dir: Path, step: int) -> InitSource | None:
    try:
        return read_manifest(run_dir, step).lineage_or_default().init_from
    except (ValueError, OSError):
        return None


def check_proxy_options(args: argparse.Namespace) -> None:
    """--policy and --pivot belong to --with-proxy, whose policy is checked before anything starts,
    rather than by the child proxy after training began."""
    if (args.policy or args.pivot) and not args.with_proxy:
        raise ConfigError(
            "--policy and --pivot are options of the proxy: use them with --with-proxy"
        )
    if getattr(args, "proxy_grace", None) is not None and not args.with_proxy:
        raise ConfigError("--proxy-grace is about the proxy --with-proxy starts: use it with that")
    if args.with_proxy:
        from andrea.daemon.mixing.policy import PolicyError
        from andrea.daemon.mixing.policystore import resolve_policy

        try:
            resolve_policy(args.run_dir, args.policy, args.pivot)
        except PolicyError as e:
            raise ConfigError(str(e)) from None


def _unsafe_options(args: argparse.Namespace, cfg: RunConfig) -> frozenset[str]:
    """The restores to skip (--unsafe-skip-restore); the unsafe options checked."""
    skip = frozenset(x for x in args.unsafe_skip_restore.split(",") if x)
    if skip - {"rng", "cursor", "buckets"}:
        raise ConfigError(
            f"--unsafe-skip-restore takes rng, cursor and/or buckets, not {sorted(skip)}"
        )
    if args.unsafe_no_coordination and cfg.mixing != "fixed":
        raise ConfigError("--unsafe-no-coordination is for benchmarks of the fixed mixture only")
    return skip
