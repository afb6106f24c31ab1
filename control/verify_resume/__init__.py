"""Resume verification: prove, with fresh processes, that stopping and resuming changes nothing.

Four paths run as separate processes: *continuous* (all updates in one life), *stop* (the first part,
then a checkpoint), *full resume* (a new process continues from that checkpoint) and *no-RNG resume*
(the same, deliberately without restoring the random generators). The full resume must reproduce the
continuous run within the tolerance in everything that decides the trajectory (consumed rows, learning
rates, losses, weights after every step, optimizer and scheduler state, progress, evaluation, the next
random draws); the no-RNG resume must diverge, which proves the comparison can see an incomplete
resume even when weights and step numbers look right.

    python -m andrea.control.verify_resume --output runs/proof [--problem mini|trainer]

``--problem mini`` is the seed's exercise (:mod:`andrea.control.mini_problem`, tolerance 1e-12).
``--problem trainer`` is the real ``andrea-trainer`` (tiny preset, CPU, one thread), stopped by a real
SIGTERM, compared bit for bit (tolerance 0), with a second negative control that skips the data cursors;
``--mixing proxy`` runs each of its paths with ``--with-proxy``, andrea-proxy in the loop.

Writes ``OUTPUT/verification.json`` and prints a table. Exit codes: 0 the full resume matches and the
negative case diverges; 1 a comparison or check failed; 2 the verification could not be completed (a
path failed, a file is missing or corrupt, the output directory exists).

The package: :mod:`.engine` (paths, comparisons, the report and its verdict), one module per problem
(:mod:`.mini`, :mod:`.trainer`), and here the command line. A problem plugs in as a function
``(output, options) -> exit code`` in :data:`PROBLEMS`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from andrea.control.verify_options import add_arguments
from andrea.control.verify_resume.mini import run_mini
from andrea.control.verify_resume.trainer import TrainerLaunch, check_user_config, run_trainer


class ProblemOptions(BaseModel):
    """What a verification run may be given besides its output directory."""

    sabotage: str | None = None
    reuse: Path | None = None
    cache_dir: Path | None = Field(
        default=None, description="The trainer's corpus cache (trainer problem only)."
    )
    config: tuple[Path, Path] | None = Field(
        default=None,
        description="The user's run config and the base of its relative paths (trainer problem only).",
    )
    launch: TrainerLaunch = Field(
        default_factory=TrainerLaunch,
        description="Device and process count (trainer problem only).",
    )


#: Problem name → runner. A runner takes (output, options) and returns the exit code.
PROBLEMS: dict[str, Callable[[Path, ProblemOptions], int]] = {
    "mini": lambda output, options: run_mini(output, options.sabotage, options.reuse),
    "trainer": lambda output, options: run_trainer(
        output, options.sabotage, options.reuse, options.cache_dir, options.config, options.launch
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m andrea.control.verify_resume",
        description=__doc__.split("\n\n")[0],
        allow_abbrev=False,
    )
    add_arguments(parser)
    parser.add_argument(
        "--run-dir", type=Path, help="trainer problem: verify on this run's run.toml (see --config)"
    )
    args = parser.parse_args(argv)
    return run_problem(parser, args)


def run_problem(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run the verification that ``args`` (parsed by ``verify_options.add_arguments``) describe;
    returns the exit code."""
    for name in ("cache_dir", "device", "nproc", "mixing"):
        if getattr(args, name, None) is not None and args.problem != "trainer":
            parser.error(f"--{name.replace('_', '-')} applies to the trainer problem only")
    nproc = getattr(args, "nproc", None)
    if nproc is not None and nproc < 1:
        parser.error("--nproc must be at least 1")
    launch = TrainerLaunch(
        device=getattr(args, "device", None),
        nproc=nproc or 1,
        mixing=getattr(args, "mixing", None) or "fixed",
    )
    config: Path | None = getattr(args, "config", None)
    run_dir: Path | None = getattr(args, "run_dir", None)
    if (config is not None or run_dir is not None) and args.problem != "trainer":
        parser.error("--config and --run-dir apply to the trainer problem only")
    if config is not None and run_dir is not None:
        parser.error("give --config or --run-dir, not both")
    prepared = None
    if config is not None or run_dir is not None:
        from andrea.daemon.config import ConfigError
        from andrea.daemon.rundir.layout import CONFIG_FILE, recorded_config

        if config is not None:
            source = config
        else:
            assert run_dir is not None  # one of the two, by the condition above
            # The config the run trains under: its flags and accepted changes included.
            source = recorded_config(run_dir) or run_dir / CONFIG_FILE
        # Relative data paths mean what the trainer makes of them: relative to the run directory,
        # or, for a config file given alone, to the directory that holds it.
        base = (run_dir if run_dir is not None else source.parent).resolve()
        try:
            # A run directory's run.toml is read where it lies (never through a link): the
            # verifier may run as root on a directory others can write.
            check_user_config(source, follow_symlinks=config is not None)
            prepared = (source, base)
        except ConfigError as e:
            print(f"verify-resume: {e}", file=sys.stderr)
            return 2
    options = ProblemOptions(
        sabotage=args.sabotage,
        reuse=args.reuse,
        cache_dir=args.cache_dir,
        config=prepared,
        launch=launch,
    )
    return PROBLEMS[args.problem](args.output, options)
