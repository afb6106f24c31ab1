"""`andrea-proxy`: the command line of the companion process (bandit, loss history, samples)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from andrea.daemon.rundir.layout import CONFIG_FILE, AlreadyRunning, SocketDirError, recorded_config
from andrea.daemon.runtime.cliargs import add_log_level_argument, add_run_dir_argument
from andrea.daemon.runtime.exitcodes import ExitCode, for_unexpected
from andrea.daemon.runtime.logsetup import setup_logging
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.runtime.sdnotify import Notifier
from andrea.protocol.transport import flush_before_exit

log = logging.getLogger("andrea.proxy")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="andrea-proxy",
        description="Data-mixing bandit and audit trail of an ANDREA run.",
        allow_abbrev=False,
    )
    add_run_dir_argument(p)
    p.add_argument(
        "--config",
        type=Path,
        help="run config (default: RUN_DIR/run.toml, written by the trainer's first start)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        help="mixing policy TOML; the first start keeps it as RUN_DIR/policy.toml, the policy in "
        "force (default: that file, else no caps or floors). One that differs from it is refused "
        "unless --pivot",
    )
    p.add_argument(
        "--pivot",
        action="store_true",
        help="with --policy: it replaces the run's policy, a new phase after the newest checkpoint",
    )
    add_log_level_argument(p)
    return p


def main(argv: list[str] | None = None) -> None:
    flags = OperatorRequests()
    flags.install()
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, "andrea-proxy")
    try:
        code = run(args, flags)
    except Exception as e:
        code, advice = for_unexpected(e)
        log.critical("%s", advice, exc_info=True)
    flush_before_exit()
    sys.exit(int(code))


def _wait_for(run_dir: Path, given: Path | None, flags: OperatorRequests) -> Path | None:
    """The run config to read: `given` (--config), else the run's recorded config
    (`recorded_config`), waited for until the trainer's first start writes it; None when a stop
    came first.

    The units start the trainer after the proxy is ready (so that a stop runs the other way: the
    trainer's final loss records reach a proxy that is still there). So on a first start the
    proxy says READY=1 before this wait, or the trainer would never start and write the file."""
    if given is not None:
        return given if given.exists() or _wait(given.exists, given, flags) else None
    path = recorded_config(run_dir)
    if path is not None:
        return path
    if not _wait(lambda: recorded_config(run_dir) is not None, run_dir / CONFIG_FILE, flags):
        return None
    return recorded_config(run_dir)


def _wait(ready: Callable[[], bool], path: Path, flags: OperatorRequests) -> bool:
    notifier = Notifier()
    log.info("waiting for %s (the trainer's first start writes it)", path)
    notifier.ready(f"waiting for {path.name} (written by the trainer's first start)")
    while not ready():
        if flags.stop_requested():
            return False
        notifier.tick()
        time.sleep(0.1)
    return True


def run(args: argparse.Namespace, flags: OperatorRequests) -> ExitCode:
    from andrea.daemon.config import ConfigError
    from andrea.daemon.data.open_settings import read_run_config
    from andrea.daemon.mixing.bandit import BanditError
    from andrea.daemon.mixing.policy import PolicyError
    from andrea.daemon.mixing.policystore import resolve_policy
    from andrea.daemon.mixing.proxy import LogContradiction, Proxy, ProxyOptions
    from andrea.daemon.rundir.losslog import LossLogError

    run_dir: Path = args.run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        log.error("--run-dir %s: not a usable directory (%s)", run_dir, e.strerror or e)
        return ExitCode.CONFIG_ERROR
    cfg_path = _wait_for(run_dir, args.config, flags)
    if cfg_path is None:
        return ExitCode.OK
    try:
        cfg = read_run_config(cfg_path, run_dir)
        resolved = resolve_policy(run_dir, args.policy, args.pivot)
    except (ConfigError, PolicyError, OSError) as e:
        log.error("%s", e)
        return ExitCode.CONFIG_ERROR
    proxy = Proxy(ProxyOptions(run_dir, cfg, resolved.policy, resolved.write, args.config), flags)
    try:
        proxy.setup()
    except LogContradiction as e:
        log.error("%s", e)
        return ExitCode.RESUME_REFUSED
    except (AlreadyRunning, SocketDirError, PolicyError, ValueError) as e:
        log.error("%s", e)
        return ExitCode.CONFIG_ERROR
    except OSError as e:  # a read-only or vanished run directory, say
        log.error("cannot set up in %s: %s", run_dir, e)
        return ExitCode.CONFIG_ERROR
    except LossLogError as e:  # .loss.json or .eval.json: the error names which
        log.error("%s", e)
        return ExitCode.RESUME_REFUSED
    except BanditError as e:
        # The run's own files contradict its config (a logged arm that is not configured):
        # every start would fail the same way.
        log.error("%s: %s", run_dir, e)
        return ExitCode.RESUME_REFUSED
    try:
        proxy.serve()
    finally:
        proxy.close()
    return proxy.exit_code


if __name__ == "__main__":
    main()
