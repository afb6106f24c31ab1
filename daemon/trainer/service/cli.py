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
from typing import IO, TYPE_CHECKING

from andrea.daemon.rundir.layout import CONFIG_FILE, RESOLVED_CONFIG_FILE
from andrea.daemon.runtime.cliargs import add_log_level_argument, add_run_dir_argument
from andrea.daemon.runtime.exitcodes import ExitCode, disk_full, for_unexpected
from andrea.daemon.runtime.logsetup import setup_logging
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.runtime.sdnotify import Notifier

if TYPE_CHECKING:
    from andrea.daemon.config import RunConfig
    from andrea.daemon.trainer.factory import Opened
    from andrea.daemon.trainer.options import TrainerOptions
    from andrea.daemon.trainer.platform.world import World
    from andrea.daemon.trainer.service.start import StartPlan
    from andrea.daemon.trainer.service.with_proxy import ProxyChild

log = logging.getLogger("andrea.trainer")


def build_parser() -> argparse.ArgumentParser:
    """andrea-trainer's options: the run directory and the launcher's own, written here; every
    config setting's flag derived from its field (daemon/trainer/service/flags.py)."""
    from andrea.daemon.trainer.service.flags import add_config_flags

    p = argparse.ArgumentParser(
        prog="andrea-trainer",
        description=(
            "Train an ANDREA GPT in a run directory; SIGTERM/SIGINT checkpoint and exit,"
            " SIGUSR1 checkpoints and continues."
        ),
        allow_abbrev=False,
    )
    add_run_dir_argument(p)
    p.add_argument(
        "--config",
        type=Path,
        metavar="run.toml",
        help="run config TOML (default: RUN_DIR/run.toml if present)",
    )
    add_config_flags(p)
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help="resume even though the training config changed since the checkpoint (on purpose)",
    )
    _add_start_arguments(p)
    _add_proxy_arguments(p)
    p.add_argument(
        "--unsafe-skip-restore", default="", metavar="rng,cursor,buckets", help=argparse.SUPPRESS
    )
    # Benchmarks only: measures what the per-step agreement of a torchrun job costs.
    p.add_argument("--unsafe-no-coordination", action="store_true", help=argparse.SUPPRESS)
    add_log_level_argument(p)
    return p


def _add_start_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="PATH/step_NNNNNN.bin",
        help="start a new run from another run's checkpoint: its weights (same model shape; "
        "the new run has its own config, data and schedule); refused into a directory that "
        "holds checkpoints",
    )
    p.add_argument(
        "--init-from-optimizer",
        action="store_true",
        help="with --init-from: Adam's moments and step count come from the checkpoint too",
    )
    p.add_argument(
        "--init-from-other-tokenizer",
        action="store_true",
        help="with --init-from: start from a checkpoint trained under another tokenizer on purpose "
        "(vocabulary surgery: each embedding row keeps its id, now another token's)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check the config, the data and the newest checkpoint against this start, without "
        "torchrun, training or writing anything; exit with the code the start would (0, 2, 4, 5)",
    )
    p.add_argument(
        "--world-size",
        metavar="N|gpu",
        help="with --check: the processes of the job to be started (torchrun's nnodes x "
        "nproc-per-node; gpu: one per visible GPU; default 1)",
    )


def _add_proxy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--with-proxy",
        action="store_true",
        help="also start andrea-proxy for this run (implies --mixing proxy); both stop together",
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="policy.toml",
        help="with --with-proxy: the proxy's mixing policy TOML (kept as RUN_DIR/policy.toml; a "
        "different one later is refused unless --pivot)",
    )
    p.add_argument(
        "--pivot",
        action="store_true",
        help="with --with-proxy --policy: the policy replaces the run's, a pivot at the newest checkpoint",
    )
    p.add_argument(
        "--proxy-grace",
        type=_seconds,
        metavar="SECONDS",
        help="with --with-proxy: after a person stops the proxy (a clean exit 0, as in the manual "
        "pivot), how long the trainer waits for one started by hand, which it then uses, before "
        "starting its own again (default 300); a crashed proxy is restarted at once",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to 86400")
    return value


def main(argv: list[str] | None = None) -> None:
    flags = OperatorRequests()
    flags.install()
    args = build_parser().parse_args(argv)
    if args.check or args.world_size is not None:
        _check(args)
    from andrea.daemon.config import ConfigError
    from andrea.daemon.trainer.platform.world import World

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
    # Each step of a start tells systemd it advances: a first start may take far longer than
    # the unit's TimeoutStartSec (it encodes the corpus), and must not be killed half-way.
    Notifier(enabled=world.is_main).preparing("starting: reading the config")
    try:
        code = run(args, flags, world)
    except Exception as e:
        code, advice = for_unexpected(e)
        # A traceback helps with what nobody foresaw, not with what a person must change.
        log.critical("%s", advice, exc_info=code == ExitCode.FAILURE)
    Notifier(enabled=world.is_main).stopping()
    # The last replies (a `stop --wait`'s answer) leave before the process does.
    from andrea.protocol.transport import flush_before_exit

    flush_before_exit()
    # Everything that matters is durable now. Tearing down torch's interpreter state takes
    # 0.5–0.8 s here, time a stop budget (TimeoutStopSec, a preemption notice) should not pay.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def _check(args: argparse.Namespace) -> None:
    """`--check`: the preflight of a start (daemon/trainer/service/preflight.py); exits with its code."""
    setup_logging(args.log_level)
    if not args.check:
        log.error("--world-size goes with --check")
        code = ExitCode.CONFIG_ERROR
    else:
        from andrea.daemon.trainer.service.preflight import run_check

        code = run_check(args)
    logging.shutdown()
    os._exit(int(code))


def run(args: argparse.Namespace, flags: OperatorRequests, world: World | None = None) -> ExitCode:
    """Start (or resume) the run `args` describe and train it; the exit code says how it ended."""
    from andrea.daemon.config import ConfigError
    from andrea.daemon.trainer.platform.world import World
    from andrea.daemon.trainer.service.start import StartRefused, plan_start

    world = world or World()
    try:
        plan = plan_start(args, world)
    except (ConfigError, OSError) as e:
        # Before the process group exists: torchrun's agent sees this rank fail and stops the others.
        if disk_full(e):
            log.error("%s; exit 3: free space, then start again", e)
            return ExitCode.CHECKPOINT_FAILED
        log.error("%s", e)
        return ExitCode.CONFIG_ERROR
    except StartRefused as e:
        log.error("%s", e.message)
        return e.code
    if world.is_main:
        log.info("held-out split: %s", plan.heldout)
        if plan.recorded:
            log.info(
                "a new run: recorded in %s what %s left open (the file is left as written): %s",
                RESOLVED_CONFIG_FILE,
                CONFIG_FILE,
                ", ".join(plan.recorded),
            )
    return _train_in_process_group(args, flags, world, plan)


def _train_in_process_group(
    args: argparse.Namespace, flags: OperatorRequests, world: World, plan: StartPlan
) -> ExitCode:
    """Join the job's process group, start the --with-proxy companion, train, and leave the group
    on every end that all ranks agreed on."""
    from andrea.daemon.rundir.layout import AlreadyRunning, SocketDirError
    from andrea.daemon.trainer.platform import determinism
    from andrea.daemon.trainer.platform.distributed import init
    from andrea.daemon.trainer.service.start import StartRefused

    # NCCL reads its settings when the communicator is made, which is now (a CUDA job).
    deterministic = determinism.resolve(plan.cfg.deterministic, plan.device)
    determinism.pin_collectives(deterministic and world.distributed, plan.device)
    backend = init(world, plan.device)
    proxy: ProxyChild | None = None
    refused: StartRefused | None = None
    try:
        lock, proxy = _start_companion(args, flags, world)
        code = _train(plan, args, flags, world, backend, lock)
        # A proxy the trainer gave up on decides the exit code of an otherwise clean stop.
        if proxy is not None and proxy.exit_code is not None and code == ExitCode.OK:
            code = proxy.exit_code
    except (AlreadyRunning, SocketDirError) as e:
        refused = StartRefused(str(e), ExitCode.CONFIG_ERROR)
    except StartRefused as e:
        refused = e
    finally:
        if proxy is not None:
            proxy.stop()
    if refused is None or refused.agreed:
        # Every rank got here with the same agreed outcome, so none waits in a collective any
        # more. Never after a refusal of this rank alone, or an exception: another rank may still
        # wait in a collective, and destroying the group would hang (torchtitan #1342); torchrun
        # stops the others instead.
        _leave_process_group(world)
    if refused is None:
        return code
    # Last, after the proxy's closing lines: the end of the output is where a person looks.
    log.error("%s", refused.message)
    return refused.code


def _start_companion(
    args: argparse.Namespace, flags: OperatorRequests, world: World
) -> tuple[IO[bytes] | None, ProxyChild | None]:
    """The run's trainer lock and the proxy of a one-command run (--with-proxy), started by rank 0
    alone once it holds the lock: a second start on a live run is refused (AlreadyRunning) before
    it uses, and would stop on its way out, the live run's proxy."""
    if not (args.with_proxy and world.is_main):
        return None, None
    from andrea.daemon.rundir.layout import claim
    from andrea.daemon.trainer.service.with_proxy import GRACE, ProxyChild

    lock = claim(args.run_dir, "trainer")
    grace = GRACE if args.proxy_grace is None else args.proxy_grace
    try:
        return lock, ProxyChild(args.run_dir, flags, args.log_level, args.policy, args.pivot, grace)
    except BaseException:
        lock.close()
        raise


def _leave_process_group(world: World) -> None:
    if world.distributed:
        from andrea.daemon.trainer.platform.distributed import shutdown

        shutdown(world)
        log.info("left the process group")


def _train(
    plan: StartPlan,
    args: argparse.Namespace,
    flags: OperatorRequests,
    world: World,
    backend: str | None,
    lock: IO[bytes] | None = None,
) -> ExitCode:
    """Build, resume and run the trainer (`lock`: the run's trainer lock, when already claimed).
    StartRefused when it cannot start (agreed by every rank when the refusal came before
    training)."""
    opened, code, message = _open(_options(plan, args, world), flags, plan, world, lock)
    # Nothing opened and no error: a stop came during start-up.
    if _agree_on_start(code, opened is None, message, world, flags) or opened is None:
        log.info("stop requested during start-up; nothing was trained, exiting")
        if opened is not None and opened.control is not None:
            opened.control.abandon(ExitCode.OK, "stopped during start-up; nothing was trained")
        return ExitCode.OK
    try:
        return _build_and_run(opened, plan, backend)
    except BaseException as e:
        # A client waiting on a stop or a checkpoint hears it, instead of waiting out its timeout.
        if opened.control is not None:
            opened.control.abandon(
                None, f"the trainer ended with an error ({e}); its log says more"
            )
        raise


def _build_and_run(opened: Opened, plan: StartPlan, backend: str | None) -> ExitCode:
    """Build the trainer from its opened context, resume and train; StartRefused naming why it
    cannot."""
    from andrea.daemon.checkpoint.manager import ResumeRefused
    from andrea.daemon.checkpoint.source import SourceError
    from andrea.daemon.config import record_resolved
    from andrea.daemon.data.livefiles import RESUME_ADVICE, TokensChanged
    from andrea.daemon.trainer.factory import build_trainer
    from andrea.daemon.trainer.links.proxy_client import ProxyRefused
    from andrea.daemon.trainer.service.start import StartRefused
    from andrea.daemon.trainer.sink import RecordLogRefused

    try:
        trainer = build_trainer(opened, backend)
    except SourceError as e:
        # --init-from names a checkpoint its payload shows damaged: the command line's (2), as a
        # damaged or missing manifest is, found before anything started.
        raise StartRefused(str(e), ExitCode.CONFIG_ERROR, agreed=True) from None
    except ResumeRefused as e:
        # Rank 0's refusal reaches every rank by its broadcast.
        raise StartRefused(str(e), ExitCode.RESUME_REFUSED, agreed=True) from None
    except RecordLogRefused as e:
        # Rank 0's alone (it alone keeps the records): torchrun stops the other ranks.
        raise StartRefused(str(e), ExitCode.RESUME_REFUSED) from None
    except OSError as e:
        # A stale temporary that cannot be removed, a run directory turned read-only: the
        # operator's to fix (2), as the same errors are while the context opens.
        raise StartRefused(f"cannot set up the run: {e}", ExitCode.CONFIG_ERROR) from None
    if plan.write_config_after_setup:
        log.warning(
            "the run's config was missing (no %s, no %s); recorded from the configuration just "
            "resumed",
            CONFIG_FILE,
            RESOLVED_CONFIG_FILE,
        )
        record_resolved(plan.cfg, plan.run_dir, plan.user_file)
    try:
        return trainer.run()
    except ProxyRefused as e:
        trainer.close()
        raise StartRefused(str(e), ExitCode.CONFIG_ERROR) from None
    except TokensChanged as e:
        # A job's rank whose step could not read its tokens (Trainer.run): the newest checkpoint
        # stays the resume point.
        trainer.close()
        raise StartRefused(
            f"{e}; no checkpoint of this step, the newest one stays valid: {RESUME_ADVICE}",
            ExitCode.DATA_ERROR,
        ) from None
    except ResumeRefused as e:
        trainer.close()
        raise StartRefused(str(e), ExitCode.RESUME_REFUSED) from None


def _options(plan: StartPlan, args: argparse.Namespace, world: World) -> TrainerOptions:
    from andrea.daemon.trainer.options import TrainerOptions

    opts = TrainerOptions(
        plan.run_dir,
        plan.cfg,
        args.allow_config_change,
        plan.skip,
        world=world,
        coordinate=not args.unsafe_no_coordination,
        config_changes=list(plan.changes),
        user_config=plan.user_file,
        init_from=plan.init_from,
        init_optimizer=args.init_from_optimizer,
    )
    if plan.skip and world.is_main:
        log.warning(
            "UNSAFE: skipping restore of %s — this run is a negative control and will diverge",
            ",".join(sorted(plan.skip)),
        )
    return opts


def _open(
    opts: TrainerOptions,
    flags: OperatorRequests,
    plan: StartPlan,
    world: World,
    lock: IO[bytes] | None = None,
) -> tuple[Opened | None, ExitCode, str]:
    """Open the trainer's context on this rank: (what it opened, exit code, why it failed); None
    opened with no error when a stop came during start-up. A mistake the operator must fix maps to
    its exit code; anything else propagates."""
    import zmq

    from andrea.daemon.config import ConfigError
    from andrea.daemon.data.sources import DataError
    from andrea.daemon.rundir.layout import AlreadyRunning, SocketDirError
    from andrea.daemon.trainer.factory import open_context
    from andrea.daemon.trainer.platform import distributed as dist
    from andrea.daemon.trainer.service.start import data_refusal

    try:
        dist.check_same(world, "the run's config", _shared_config(plan.cfg))
        return open_context(opts, flags, plan.device, lock=lock), ExitCode.OK, ""
    except InterruptedError:
        return None, ExitCode.OK, ""
    except (AlreadyRunning, SocketDirError, ConfigError, dist.DistributedError) as e:
        return None, ExitCode.CONFIG_ERROR, str(e)
    except DataError as e:
        # A glob that names something other than data (a file of /proc, a FIFO): the config's.
        refused, message = data_refusal(e)
        return None, refused, message
    except (OSError, zmq.ZMQError) as e:
        # A read-only run directory, an unusable --cache-dir, a socket path that cannot be bound:
        # the operator's to fix, and a restart would repeat it.
        return None, ExitCode.CONFIG_ERROR, f"cannot set up the run: {e}"


def _agree_on_start(
    code: ExitCode, stopped: bool, message: str, world: World, flags: OperatorRequests
) -> bool:
    """Start-up ends in an agreed outcome: a rank that fails or is stopped there takes every other
    rank with it, instead of leaving them in the next collective. Whether to stop before training;
    StartRefused (agreed) when any rank failed."""
    from andrea.daemon.trainer.platform import distributed as dist
    from andrea.daemon.trainer.service.start import StartRefused

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
    return stopped


def _shared_config(cfg: RunConfig) -> str:
    """What every rank of a job must agree on: the whole config but where each node caches data."""
    from andrea.daemon.config import canonical_json

    dump = cfg.model_dump(mode="json")
    dump["data"] = {k: v for k, v in dump["data"].items() if k != "cache_dir"}
    return canonical_json(dump)


if __name__ == "__main__":
    main()
