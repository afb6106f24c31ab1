"""`andrea-trainer`: the command line of the trainer daemon.

Signal handlers are installed before anything slow (importing torch, building the corpus), so a
SIGTERM that arrives during start-up is a clean exit, not a kill.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .exitcodes import ExitCode, for_unexpected
from .process import Notifier, SignalFlags, add_log_level_argument, setup_logging
from .rundir import CONFIG_FILE

if TYPE_CHECKING:
    import torch

    from .config import RunConfig
    from .distributed import World

log = logging.getLogger("andrea.trainer")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="andrea-trainer",
        description=(
            "Train an ANDREA GPT in a run directory; SIGTERM/SIGINT checkpoint and exit,"
            " SIGUSR1 checkpoints and continues."
        ),
    )
    p.add_argument(
        "--run-dir", type=Path, required=True, help="the run's directory (created if missing)"
    )
    p.add_argument(
        "--config", type=Path, help="run config TOML (default: RUN_DIR/run.toml if present)"
    )
    p.add_argument("--preset", help="andrea-tiny | andrea-12m | andrea-120m")
    p.add_argument(
        "--max-steps", type=int, help="stop (with a checkpoint) after this many optimizer steps"
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        help="cadence of checkpoints in steps (0: only on request/exit)",
    )
    p.add_argument(
        "--seed", type=int, help="seed of every random stream of the run (preset default: 1337)"
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        help="auto: CUDA when available (default: auto)",
    )
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "tf32", "bf16"],
        help="arithmetic of the step: auto = bf16 autocast on CUDA, fp32 on CPU (see docs/performance.md)",
    )
    p.add_argument(
        "--mixing", choices=["fixed", "proxy"], help="fixed mixture (default) or the proxy's bandit"
    )
    p.add_argument(
        "--with-proxy",
        action="store_true",
        help="also start andrea-proxy for this run (implies --mixing proxy); both stop together",
    )
    p.add_argument(
        "--policy",
        type=Path,
        help="with --with-proxy: the proxy's mixing policy TOML (kept as RUN_DIR/policy.toml; a "
        "different one later is refused unless --pivot)",
    )
    p.add_argument(
        "--pivot",
        action="store_true",
        help="with --with-proxy --policy: the policy replaces the run's, a pivot at the newest checkpoint",
    )
    p.add_argument(
        "--threads", type=int, help="torch intra-op threads (bit-exact resume needs the same count)"
    )
    p.add_argument("--batch-size", type=int, help="sequences per micro-batch (preset default: 8)")
    p.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step (default 1)")
    p.add_argument(
        "--eval-every",
        type=int,
        help="steps between held-out evaluations (default: the checkpoint cadence; 0: never)",
    )
    p.add_argument(
        "--heldout-fraction",
        type=float,
        help="a new run's fraction of documents held out for evaluation (default 0.05)",
    )
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        help="torch.compile the model for training: auto = on for CUDA, off on CPU",
    )
    p.add_argument(
        "--decay-steps",
        type=int,
        help="length of the LR schedule: cosine decay to min_lr ends at this step, then flat "
        "(optim.decay_steps; default: the preset's). Independent of --max-steps, so that extending "
        "a run never changes the LR of steps already planned",
    )
    p.add_argument("--log-every", type=int, help="steps between progress lines (default: 10)")
    p.add_argument("--sample-every", type=int, help="steps between generated samples (0: never)")
    p.add_argument("--cache-dir", help="where tokenized data is cached")
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even though the training config changed since the checkpoint (on purpose)",
    )
    p.add_argument(
        "--deterministic",
        choices=["auto", "on", "off"],
        help="deterministic algorithms and attention: auto = on for CUDA, off on CPU",
    )
    p.add_argument(
        "--unsafe-skip-restore", default="", metavar="rng,cursor", help=argparse.SUPPRESS
    )
    # Benchmarks only: measures what the per-step agreement of a torchrun job costs.
    p.add_argument("--unsafe-no-coordination", action="store_true", help=argparse.SUPPRESS)
    add_log_level_argument(p)
    return p


def main(argv: list[str] | None = None) -> None:
    flags = SignalFlags()
    flags.install()
    args = build_parser().parse_args(argv)
    from .config import ConfigError
    from .distributed import World

    try:
        world = World.from_environ()
    except ConfigError as e:
        setup_logging(args.log_level)
        log.error("%s", e)
        os._exit(int(ExitCode.CONFIG_ERROR))
    setup_logging(
        args.log_level,
        tag="trainer" if args.with_proxy else None,
        rank=world.rank if world.distributed else None,
    )
    try:
        code = run(args, flags, world)
    except Exception as e:
        code, advice = for_unexpected(e)
        log.critical("%s", advice, exc_info=True)
    Notifier(enabled=world.is_main).stopping()
    # Everything that matters is durable now. Tearing down torch's interpreter state takes
    # 0.5–0.8 s here, time a stop budget (TimeoutStopSec, a preemption notice) should not pay.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def run(args: argparse.Namespace, flags: SignalFlags, world: World | None = None) -> ExitCode:
    from .config import (
        ConfigError,
        build_config,
        config_changes,
        for_new_run,
        load_toml,
        save_config,
    )
    from .distributed import World

    world = world or World()

    run_dir: Path = args.run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = args.config or (run_dir / CONFIG_FILE)
        # Whether this run already has its own run.toml (read once: another rank of a job may
        # write it in the meantime).
        run_toml_existed = (run_dir / CONFIG_FILE).exists()
        file_values = load_toml(cfg_path) if (args.config or cfg_path.exists()) else {}
        run_preset = file_values.get("preset")
        if args.preset and run_preset and args.preset != run_preset:
            raise ConfigError(
                f"--preset {args.preset} disagrees with this run's preset {run_preset} ({cfg_path}): "
                "a run keeps its model; drop --preset, or start a new run directory"
            )
        data_overrides: dict = {"cache_dir": args.cache_dir} if args.cache_dir else {}
        if args.heldout_fraction is not None:
            data_overrides["heldout_fraction"] = args.heldout_fraction
        overrides = {
            "preset": args.preset,
            "max_steps": args.max_steps,
            "seed": args.seed,
            "device": args.device,
            "precision": args.precision,
            "mixing": "proxy" if args.with_proxy else args.mixing,
            "threads": args.threads,
            "deterministic": args.deterministic,
            "batch_size": args.batch_size,
            "grad_accum": args.grad_accum,
            "compile": args.compile,
            "log_every": args.log_every,
            "sample_every": args.sample_every,
        }
        if args.checkpoint_every is not None:
            overrides["checkpoint"] = {"every": args.checkpoint_every}
        if args.decay_steps is not None:
            overrides["optim"] = {"decay_steps": args.decay_steps}
        if data_overrides:
            overrides["data"] = data_overrides
        if args.eval_every is not None:
            overrides["eval"] = {"every": args.eval_every}
        cfg = build_config(file_values, overrides, source=str(cfg_path))
        from .checkpoint.manager import checkpoint_steps

        # Without run.toml the flags describe a run as this version creates it: with the default
        # held-out split. A run that lost its run.toml is then resumed only if its checkpoints
        # agree; one older than splits is refused naming data.heldout_fraction, and
        # --heldout-fraction 0 restores it.
        if not run_toml_existed:
            cfg = for_new_run(cfg)
        # A device or precision this machine cannot run is refused before run.toml records it.
        from .distributed import device_for
        from .precision import resolve, resolve_device

        device = device_for(world, resolve_device(cfg.device))
        resolve(cfg.precision, device)
        if cfg.batch_size % world.size:
            raise ConfigError(
                f"batch_size {cfg.batch_size} is the global batch of a step; it must be divisible by "
                f"the world size {world.size} (each rank trains on an equal share)"
            )
        # A run that has checkpoints but lost its run.toml gets one only once the resume is
        # accepted: written now, a refusal would leave the defaults recorded for every restart.
        # Rank 0 alone writes the run directory; the others read what it wrote (atomically).
        write_config_after_setup = (
            world.is_main
            and not (run_dir / CONFIG_FILE).exists()
            and bool(checkpoint_steps(run_dir))
        )
        changes: list[str] = []
        if world.is_main and run_toml_existed:
            # Flags that change the trajectory the run's own file describes: named, and refused
            # unless deliberate (then recorded in run.toml once the resume has been accepted).
            recorded = build_config(load_toml(run_dir / CONFIG_FILE), source=CONFIG_FILE)
            changes = config_changes(recorded.trajectory(), cfg.trajectory())
            if changes and not args.allow_config_change:
                log.error(
                    "this start changes the run's training config (%s): %s; pass "
                    "--allow-config-change to continue under the new one on purpose",
                    run_dir / CONFIG_FILE,
                    "; ".join(changes),
                )
                return ExitCode.RESUME_REFUSED
        if world.is_main and not (run_dir / CONFIG_FILE).exists() and not write_config_after_setup:
            save_config(cfg, run_dir / CONFIG_FILE)
        if (args.policy or args.pivot) and not args.with_proxy:
            raise ConfigError(
                "--policy and --pivot are options of the proxy: use them with --with-proxy"
            )
        if args.with_proxy:
            # Refused here, before anything starts, rather than by the child proxy after training began.
            from .mixing.policy import PolicyError
            from .mixing.policystore import resolve_policy

            try:
                resolve_policy(run_dir, args.policy, args.pivot)
            except PolicyError as e:
                raise ConfigError(str(e)) from None
        skip = frozenset(x for x in args.unsafe_skip_restore.split(",") if x)
        if skip - {"rng", "cursor"}:
            raise ConfigError(f"--unsafe-skip-restore takes rng and/or cursor, not {sorted(skip)}")
        if args.unsafe_no_coordination and cfg.mixing != "fixed":
            raise ConfigError(
                "--unsafe-no-coordination is for benchmarks of the fixed mixture only"
            )
    except (ConfigError, OSError) as e:
        # Before the process group exists: torchrun's agent sees this rank fail and stops the others.
        log.error("%s", e)
        return ExitCode.CONFIG_ERROR

    from .companion import Companion
    from .distributed import init, shutdown
    from .rundir import AlreadyRunning, SocketDirError

    backend = init(world, device)
    proxy = (
        Companion(run_dir, flags, args.log_level, args.policy, args.pivot)
        if args.with_proxy and world.is_main
        else None
    )
    refused: StartRefused | None = None
    code = ExitCode.OK
    try:
        code = _train(
            run_dir,
            cfg,
            args,
            flags,
            skip,
            world,
            device,
            backend,
            write_config_after_setup,
            changes,
        )
    except (AlreadyRunning, SocketDirError) as e:
        refused = StartRefused(str(e), ExitCode.CONFIG_ERROR)
    except StartRefused as e:
        refused = e
    else:
        # A proxy the trainer gave up on decides the exit code of an otherwise clean stop.
        if proxy is not None and proxy.exit_code is not None and code == ExitCode.OK:
            return proxy.exit_code
        return code
    finally:
        if proxy is not None:
            proxy.stop()
    if refused is None or refused.agreed:
        # Every rank got here with the same agreed outcome, so none waits in a collective any
        # more; after a refusal of one rank alone, torchrun stops the others instead.
        shutdown(world)
    if refused is None:
        # A proxy the trainer gave up on decides the exit code of an otherwise clean stop.
        if proxy is not None and proxy.exit_code is not None and code == ExitCode.OK:
            return proxy.exit_code
        return code
    # Last, after the proxy's closing lines: the end of the output is where a person looks.
    log.error("%s", refused.message)
    return refused.code


class StartRefused(Exception):
    """The trainer cannot start on this run directory; the message says why, the code tells systemd."""

    def __init__(self, message: str, code: ExitCode, agreed: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        #: Every rank of a job refuses alike (so none waits in a collective any more).
        self.agreed = agreed


def _train(
    run_dir: Path,
    cfg: RunConfig,
    args: argparse.Namespace,
    flags: SignalFlags,
    skip: frozenset[str],
    world: World,
    device: torch.device,
    backend: str | None,
    write_config_after_setup: bool = False,
    changes: list[str] | None = None,
) -> ExitCode:
    import zmq

    from . import distributed as dist
    from .checkpoint.manager import ResumeRefused
    from .config import ConfigError, save_config
    from .data import DataError
    from .proxy_link import ProxyRefused
    from .rundir import AlreadyRunning, SocketDirError
    from .trainer import Trainer, TrainerOptions

    opts = TrainerOptions(
        run_dir,
        cfg,
        args.allow_config_change,
        skip,
        world=world,
        coordinate=not args.unsafe_no_coordination,
        config_changes=list(changes or []),
    )
    trainer = Trainer(opts, flags)
    trainer.backend = backend
    if skip and world.is_main:
        log.warning(
            "UNSAFE: skipping restore of %s — this run is a negative control and will diverge",
            ",".join(sorted(skip)),
        )
    # Start-up ends in an agreed outcome: a rank that fails or is stopped there takes every other
    # rank with it, instead of leaving them in the next collective.
    code, stopped, message = ExitCode.OK, False, ""
    try:
        dist.check_same(world, "the run's config", _shared_config(cfg))
        trainer.build(device)
    except InterruptedError:
        stopped = True
    except (AlreadyRunning, SocketDirError, ConfigError, dist.DistributedError) as e:
        code, message = ExitCode.CONFIG_ERROR, str(e)
    except DataError as e:
        code, message = ExitCode.DATA_ERROR, f"data: {e}"
    except (OSError, zmq.ZMQError) as e:
        # A read-only run directory, an unusable --cache-dir, a socket path that cannot be bound:
        # the operator's to fix, and a restart would repeat it.
        code, message = ExitCode.CONFIG_ERROR, f"cannot set up the run: {e}"
    if world.distributed:
        agreed = ExitCode(dist.agree_code(world, int(code)))
        if agreed != ExitCode.OK and not message:
            message = (
                f"another rank of the job could not start (exit {int(agreed)}); its log says why"
            )
        code = agreed
        stopped = bool(dist.agree_code(world, int(stopped or flags.stop_requested())))
    if code != ExitCode.OK:
        raise StartRefused(message, code, agreed=True)
    if stopped:
        log.info("stop requested during start-up; nothing was trained, exiting")
        return ExitCode.OK
    try:
        trainer.resume()
    except ResumeRefused as e:
        # Rank 0's refusal reaches every rank by its broadcast.
        raise StartRefused(str(e), ExitCode.RESUME_REFUSED, agreed=True) from None
    if write_config_after_setup:
        log.warning("%s was missing; rewritten from the configuration just resumed", CONFIG_FILE)
        save_config(cfg, run_dir / CONFIG_FILE)
    try:
        return trainer.run()
    except ProxyRefused as e:
        trainer.close()
        raise StartRefused(str(e), ExitCode.CONFIG_ERROR) from None
    except ResumeRefused as e:
        trainer.close()
        raise StartRefused(str(e), ExitCode.RESUME_REFUSED) from None


def _shared_config(cfg: RunConfig) -> str:
    """What every rank of a job must agree on: the whole config but where each node caches data."""
    from .config import canonical_json

    dump = cfg.model_dump(mode="json")
    dump["data"] = {k: v for k, v in dump["data"].items() if k != "cache_dir"}
    return canonical_json(dump)


if __name__ == "__main__":
    main()
