"""Valid instances of every file the daemons read, built in-process, for the hostile-input tests
and the fuzz harness: each test damages one thing and checks the documented outcome."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import IO

import numpy as np

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint import rngstate
from andrea.daemon.checkpoint.manager import CheckpointManager, Expectation, Snapshot, layout_of
from andrea.daemon.checkpoint.manifest import Environment, MixingState, OptimizerState, Progress
from andrea.daemon.config import CheckpointConfig, ModelConfig, RunConfig, build_config
from andrea.daemon.data.arms import CursorState
from andrea.daemon.rundir.layout import claim
from andrea.daemon.trainer.schedule import scheduler_state
from andrea.protocol import messages

MODEL = ModelConfig(block_size=8, n_layer=1, n_head=1, n_embd=8, dropout=0.0)
ARMS = {"docstrings": "a" * 64, "code": "b" * 64}
CHUNKS = 50


@functools.cache
def layout():
    from andrea.daemon.model import GPT

    model = GPT(MODEL)
    return layout_of((n, tuple(p.shape)) for n, p in model.named_parameters())


def expectation(**kw) -> Expectation:
    cfg = build_config({}, {"preset": "andrea-tiny"})
    return Expectation(
        model=MODEL,
        layout=layout(),
        data_identities=dict(ARMS),
        config_hash=cfg.trajectory_hash(),
        **kw,
    )


def write_checkpoint(
    run_dir: Path, step: int, trigger: str = "cadence", mixing: str = "fixed"
) -> None:
    """One complete, valid checkpoint of `step` as the trainer writes it."""
    mgr = CheckpointManager(run_dir, CheckpointConfig(every=0, keep_latest=100))
    try:
        mgr.save(snapshot(step, mixing), trigger)
    finally:
        mgr.close()


def write_checkpoint_with(mgr: CheckpointManager, step: int, trigger: str = "sigusr1") -> None:
    """Save one more checkpoint through an existing manager (its retention applies)."""
    mgr.save(snapshot(step), trigger)


def snapshot(step: int, mixing: str = "fixed") -> Snapshot:
    """A valid snapshot of `step`, as the trainer hands it to the checkpoint manager."""
    cfg = build_config({}, {"preset": "andrea-tiny"})
    lay = layout()
    n = sum(int(np.prod(e.shape)) for e in lay)
    rng = np.random.default_rng(step)
    w, m, v = (rng.standard_normal(n).astype("<f4") for _ in range(3))
    fields = dict(
        layout=lay,
        model=MODEL,
        optimizer=OptimizerState(
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=0.1,
            grad_clip=1.0,
            fused=True,
            adam_step=step,
        ),
        scheduler=scheduler_state(step, cfg.optim),
        rng=rngstate.capture(),
        data=[
            CursorState(name=a, identity=i, n_tokens=401, n_chunks=CHUNKS, epoch=0, position=step)
            for a, i in ARMS.items()
        ],
        mixing=MixingState(mode=mixing, phase=0, arms=list(ARMS)),
        progress=Progress(step=step, tokens_seen=step * 64, segment=1, train_seconds=1.0),
        environment=Environment(
            device="cpu",
            dtype="fp32",
            threads=1,
            torch_version="x",
            numpy_version="x",
            python_version="x",
            code_version="x",
        ),
        config_hash=cfg.trajectory_hash(),
        config=cfg.model_dump(mode="json"),
    )
    # The payload as the trainer stages it: header, then weights, m and v, little-endian float32.
    header = np.frombuffer(checkpoint_format.HEADER.pack(step, n), dtype=np.uint8)
    payload = np.concatenate([header, np.concatenate([w, m, v]).view(np.uint8)])
    return Snapshot(step=step, fields=fields, payload=payload)


def resign(man: dict) -> dict:
    """Recompute a manifest's content hash exactly as docs/checkpoint-format.md defines it (written
    here from the spec, not by calling the code under test)."""
    body = {k: v for k, v in man.items() if k != "content_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {**body, "content_sha256": hashlib.sha256(canonical.encode()).hexdigest()}


def text_arms_config(run_dir: Path, **extra) -> RunConfig:
    """A run config with two small text arms inside `run_dir` (no corpus to build)."""
    for name in ("alpha", "beta"):
        (run_dir / "src" / name).mkdir(parents=True, exist_ok=True)
        (run_dir / "src" / name / "a.txt").write_text((name + " text to train on. ") * 200)
    arms = [
        {"name": name, "kind": "text", "paths": [f"src/{name}/*.txt"]} for name in ("alpha", "beta")
    ]
    return build_config(
        {"data": {"arms": arms, "cache_dir": str(run_dir / "cache")}, "mixing": "proxy", **extra},
        {"preset": "andrea-tiny"},
    )


#: The life secret of the trainer that the in-process proxy tests play.
TRAINER_LIFE = "feedface" * 4


def play_trainer(run_dir: Path) -> IO[bytes]:
    """Hold the run's trainer lock in this process, as a trainer does, so that this process's
    hellos (`trainer_hello`) may start a trainer life; close it to let go."""
    return claim(run_dir, "trainer")


def trainer_hello(cfg: RunConfig, id: str = "h", **kw) -> messages.Hello:
    """The hello of the trainer this process plays (see `play_trainer`)."""
    fields = dict(
        id=id,
        resume_step=0,
        seed=cfg.seed,
        arms=["alpha", "beta"],
        pid=os.getpid(),
        life=TRAINER_LIFE,
    )
    return messages.Hello(**{**fields, **kw})
