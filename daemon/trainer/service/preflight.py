"""`andrea-trainer --check`: what a start would refuse, found before torchrun starts any rank.

torchrun reports every failed worker as exit 1, so under `andrea-trainer-ddp@.service` a config
error (2), a refused resume (4) or missing data (5) would look like a crash and be restarted until
the start limit, every start cold-starting every rank. The unit runs this check first
(`ExecStartPre=`): one process, no process group, nothing written, and the exit code a start of
the job would give. It checks the config and the start options as a start resolves them, each
arm's data (that it exists, what it is, and the first record of each of its files, without
tokenizing it), and the newest checkpoint
whose manifest is intact against this config, data and world size. The payload's sha256 is left
to the start, which reads it anyway (and falls back to an older checkpoint if it is damaged).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from andrea.daemon.checkpoint.format import payload_size
from andrea.daemon.checkpoint.manager import (
    Expectation,
    checkpoint_steps,
    layout_of,
    read_manifest,
    resume_problems,
)
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import ConfigError, RunConfig
from andrea.daemon.data.arms import DataError, arm_identity, too_few_tokens
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.rundir.layout import bin_name, manifest_name
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.trainer.platform.world import World
from andrea.daemon.trainer.service.start import StartPlan, StartRefused, data_refusal, plan_start

log = logging.getLogger("andrea.trainer")


def run_check(args: argparse.Namespace) -> ExitCode:
    """Check the start `args` describe, for a job of `--world-size` processes; log the outcome and
    return the exit code that start would have (0: it would start)."""
    try:
        world = World(size=job_size(args.world_size))
        plan = plan_start(args, world, write=False)
        identities = _data_identities(plan.cfg, args)
        where = _check_checkpoint(plan, identities, args.allow_config_change)
    except ConfigError as e:
        log.error("%s", e)
        return ExitCode.CONFIG_ERROR
    except StartRefused as e:
        log.error("%s", e.message)
        return e.code
    except DataError as e:
        code, message = data_refusal(e)
        log.error("%s", message)
        return code
    except OSError as e:
        log.error("cannot read the run: %s", e)
        return ExitCode.CONFIG_ERROR
    log.info("check passed for a job of %d process(es): %s", world.size, where)
    return ExitCode.OK


def job_size(value: str | None) -> int:
    """`--world-size`: a number of processes, or `gpu` for one per visible GPU (as torchrun's
    --nproc-per-node takes it)."""
    if value is None:
        return 1
    if value == "gpu":
        import torch

        count = torch.cuda.device_count()
        if count < 1:
            raise ConfigError("--world-size gpu: this machine shows no GPU")
        return count
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"--world-size takes a number of processes or 'gpu', not {value!r}")
    return int(value)


def _data_identities(cfg: RunConfig, args: argparse.Namespace) -> dict[str, str]:
    """Each arm's identity (a tokens arm's file is read whole for it), after the first record of
    each of its files has been read as the start reads it."""
    identities = {}
    for spec in cfg.data.arms:
        identities[spec.name] = arm_identity(spec, cfg.data, args.run_dir, cfg.model.vocab_size)
        # The first record of each file (the first document, a Parquet file's footer), as the
        # start reads it: a bad file fails here (exit 5, naming the arm, the file and the
        # record), and so do files that hold no document at all (the start's 0 training tokens).
        # The rest of each file is the start's to read.
        kind = kinds.kind(spec.kind)
        if not kind.first_records(spec, args.run_dir, cfg.data.document_bound):
            raise DataError(too_few_tokens(spec.name, 0, cfg.model.block_size + 1))
    return identities


def _check_checkpoint(plan: StartPlan, identities: dict[str, str], allow_change: bool) -> str:
    """What the start would resume, checked against this config; StartRefused (exit 4) for a
    checkpoint it would refuse, or when every checkpoint is damaged."""
    run_dir = plan.run_dir
    steps = checkpoint_steps(run_dir) if run_dir.is_dir() else []
    if not steps:
        return "a new run" + (f" from {plan.init_from}" if plan.init_from else "")
    expect = _expectation(plan.cfg, identities, allow_change)
    skipped: list[str] = []
    for step in steps:
        manifest = _sound_manifest(run_dir, step, skipped)
        if manifest is None:
            continue
        if problems := resume_problems(manifest, expect):
            raise StartRefused(
                f"checkpoint {bin_name(step)} cannot resume this run:\n  " + "\n  ".join(problems),
                ExitCode.RESUME_REFUSED,
            )
        return f"resumes {bin_name(step)}" + (
            f" (written by a job of {manifest.environment.world_size})"
            if manifest.environment.world_size != 1
            else ""
        )
    raise StartRefused(
        f"none of the {len(steps)} checkpoints in {run_dir} is intact:\n  " + "\n  ".join(skipped),
        ExitCode.RESUME_REFUSED,
    )


def _sound_manifest(run_dir: Path, step: int, skipped: list[str]) -> Manifest | None:
    """The verified manifest of `step` when its payload has the size it declares; else None,
    with the reason added to `skipped`."""
    try:
        manifest = read_manifest(run_dir, step)
        size = (run_dir / bin_name(step)).stat().st_size
    except (ValueError, OSError) as e:
        skipped.append(f"{manifest_name(step)}: {e}")
        return None
    if size != payload_size(manifest.n_params):
        skipped.append(f"{manifest_name(step)}: payload is {size} bytes, not {manifest.bin_size}")
        return None
    return manifest


def _expectation(cfg: RunConfig, identities: dict[str, str], allow_change: bool) -> Expectation:
    # The layout of the model the start would build, on the meta device: shapes, no memory.
    import torch

    from andrea.daemon.model import GPT

    with torch.device("meta"):
        model = GPT(cfg.model)
    return Expectation(
        model=cfg.model,
        layout=layout_of((n, tuple(p.shape)) for n, p in model.named_parameters()),
        data_identities=identities,
        config_hash=cfg.trajectory_hash(),
        allow_config_change=allow_change,
        trajectory=cfg.trajectory(),
    )
