"""The trainer is built in one pass (daemon/trainer/factory.py): once built, neither it nor any of
its collaborators has an attribute left None for a later step to fill in."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from andrea.daemon.config import build_config
from andrea.daemon.runtime.exitcodes import ExitCode
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.trainer.factory import assemble
from andrea.daemon.trainer.loop import Trainer
from andrea.daemon.trainer.options import TrainerOptions

#: Attributes that are None by what they mean, not by wiring: (class, attribute) → why.
STATE = {
    ("Trainer", "_previous"): "no step recorded yet",
    ("Evaluation", "last_eval"): "no evaluation yet",
    ("Reporter", "prometheus"): "this config asks for no metrics exposition",
    ("Reporter", "_wait_since"): "not waiting for the proxy",
    ("Restorer", "_pending_rng"): "a fresh run has no generators to restore",
    ("Snapshotter", "_environment"): "computed at the first checkpoint",
    ("FileSink", "unlogged"): "every record so far was written",
    ("Snapshotter", "backend"): "a single process has no process group",
    ("Batches", "_ahead"): "nothing drawn ahead before the first step",
    ("CrossCheck", "_columns"): "the loss log is read when first needed",
    ("Evaluation", "_prompts"): "the samples' prompts are decided at the first sampling",
    ("ControlServer", "_status_cache"): "no status asked for yet",
    ("HoldRegistry", "_hold"): "no pivot's hold requested",
    ("HoldRegistry", "_done"): "no hold ended yet",
    ("Checkpointer", "diverged"): "the run has not diverged",
    ("Checkpointer", "failure"): "no final checkpoint has failed to be written",
}


#: Records of plain values (the counters, the options, the data and model, a trained step), whose
#: None fields mean "not yet" or "none": not collaborators.
DATA = {"Counters", "TrainerOptions", "Parts", "Platform", "TrainedStep", "EvalPlan"}

#: The packages whose objects the walk follows: the trainer's, and the trainer's side of
#: checkpoints (the checkpointer, the snapshots, the restorer and its cross-check).
WALKED = ("andrea.daemon.trainer.", "andrea.daemon.checkpoint.training.")


def _tiny(run_dir: Path, cache: Path) -> TrainerOptions:
    run_dir.mkdir()
    cfg = build_config(
        {},
        {
            "preset": "andrea-tiny",
            "threads": 1,
            "max_steps": 3,
            "sample_every": 0,
            "data": {"cache_dir": str(cache)},
        },
    )
    return TrainerOptions(run_dir, cfg)


def _fields(obj: object) -> dict[str, object]:
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return dict(vars(obj))


def _left_none(trainer: Trainer) -> tuple[list[str], set[str]]:
    """Every attribute that is None without being listed in STATE, of the trainer and of every
    object of WALKED's packages it reaches (its context and collaborators, theirs in turn; the
    plain records of values, DATA, are not walked); and the classes walked."""
    found, walked = [], set()
    todo: list[tuple[str, object]] = [("trainer", trainer)]
    seen = {id(trainer)}
    while todo:
        where, owner = todo.pop()
        walked.add(type(owner).__name__)
        for name, value in _fields(owner).items():
            if value is None and (type(owner).__name__, name) not in STATE:
                found.append(f"{where}.{name}")
            kind = type(value)
            if (
                kind.__module__.startswith(WALKED)
                and kind.__name__ not in DATA
                and id(value) not in seen
            ):
                seen.add(id(value))
                todo.append((f"{where}.{name}", value))
    return sorted(found), walked


def test_nothing_is_left_none_after_the_build(tmp_path: Path, cache_dir: Path) -> None:
    trainer = assemble(_tiny(tmp_path / "run", cache_dir), OperatorRequests())
    try:
        left, walked = _left_none(trainer)
        assert left == []
        # The walk reached every collaborator (a renamed attribute would hide one from it).
        assert {
            "TrainerContext",
            "Restorer",
            "CrossCheck",
            "Checkpointer",
            "Storage",
            "Snapshotter",
            "StepRunner",
            "Batches",
            "Evaluation",
            "Reporter",
            "PhaseFollower",
            "FileSink",
            "ControlServer",
            "HoldRegistry",
        } <= walked
        assert trainer.control is not None and trainer.lock is not None  # rank 0's
    finally:
        trainer.ctx.flags.request_stop("sigterm")
        assert trainer.finish() == ExitCode.OK
