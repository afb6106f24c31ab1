"""The training loop of andrea-trainer: build, resume, train, checkpoint, stop.

Everything that decides a bit of the trajectory is either saved in the checkpoint (weights, Adam's
m and v and step count, every RNG, each arm's cursor, progress) or a pure function of the step
(learning rate, the arm of each step, each epoch's data order). Restore order follows the
verification protocol: build model and optimizer, load their state, restore data cursors, and
restore the RNGs last, right before the first step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import torch

from andrea.protocol import messages as m
from andrea.protocol.lossentry import LossEntry
from andrea.protocol.status import Activity, TrainerStatus
from andrea.protocol.transport import new_id

from .. import cudaenv, determinism, schedule
from .. import distributed as dist
from ..checkpoint import rngstate
from ..checkpoint.format import Payload as fmt_Payload
from ..checkpoint.manager import (
    CheckpointManager,
    Expectation,
    Loaded,
    ResumeRefused,
    Snapshot,
    layout_of,
)
from ..checkpoint.manifest import (
    DistributedState,
    Environment,
    LayoutEntry,
    Manifest,
    MixingState,
    OptimizerState,
    Progress,
    RankState,
    Trigger,
    code_version,
)
from ..checkpoint.rngstate import RngState
from ..checkpoint.state import load_adam_state, load_weights
from ..checkpoint.writer import StagingBuffer
from ..config import ConfigError, RunConfig, config_changes, record_trajectory, trajectory_of
from ..control_server import ControlServer
from ..data import Arm, ArmStream, FixedMixture, load_arms
from ..evallog import ArmEval, EvalEntry, EvalLog
from ..evaluate import Evaluator
from ..exitcodes import ExitCode
from ..hold import Holds
from ..losslog import LossLog, LossLogError, last_entry
from ..metrics.prometheus import exposition_for
from ..metrics.series import ema_update
from ..model import GPT
from ..precision import NumericMode, resolve_device
from ..precision import resolve as resolve_precision
from ..process import REQUESTED_TRIGGERS, Notifier, SignalFlags, StopReason
from ..progress import RunSummary, eta_seconds, format_duration, journal_fields
from ..proxy_link import ProxyLink
from ..rundir import CONFIG_FILE, EVAL_FILE, LOSS_FILE, bin_name, claim, endpoint, peer_endpoint
from ..schedule import lr_at, scheduler_state

log = logging.getLogger(__package__)

SAMPLE_PROMPTS = ("def ", "The ", "# ")


@dataclass
class TrainerOptions:
    run_dir: Path
    cfg: RunConfig
    allow_config_change: bool = False
    #: Deliberately broken resumes, for the resume proof's negative control only ("rng", "cursor").
    skip_restore: frozenset[str] = field(default_factory=frozenset)
    #: This process's place in a torchrun job (a world of one by default).
    world: dist.World = field(default_factory=dist.World)
    #: False only to measure what the per-step agreement costs (tests/bench/bench_distributed.py).
    coordinate: bool = True
    #: Changes to the run's run.toml accepted with --allow-config-change, recorded there once the
    #: resume is accepted and before the proxy is told (it re-reads the file on a changed seed).
    config_changes: list[str] = field(default_factory=list)


class Trainer:
    """One life ("segment") of the trainer process over one run directory.

    In a torchrun job every rank runs one Trainer. Global rank 0 alone owns the control socket,
    the proxy link (or the loss log), systemd notifications and the checkpoint writes; every
    decision that changes what ranks do next (stop, checkpoint, hold, the arm of the next step) is
    agreed at a step boundary by one collective (`distributed.Coordinator`)."""

    def __init__(
        self, opts: TrainerOptions, flags: SignalFlags, notifier: Notifier | None = None
    ) -> None:
        self.opts = opts
        self.cfg = opts.cfg
        self.run_dir = opts.run_dir
        self.world = opts.world
        self.main = opts.world.is_main
        self.flags = flags
        self.notifier = notifier or Notifier(enabled=self.main)
        self.coord = dist.Coordinator(opts.world, enabled=opts.coordinate)
        self.backend: str | None = None
        self.activity = Activity.STARTING
        self.holds = Holds()
        #: A change accepted with --allow-config-change that no checkpoint records yet.
        self.config_changed = False
        self.step = 0
        self.tokens_seen = 0
        self.train_seconds = 0.0
        self.loss_ema: float | None = None
        #: The trainer process life; with the proxy, 0 until the proxy has numbered it.
        self.segment = 0
        self.phase = 0
        self.last_saved = 0
        self.last_saved_at: float | None = None  # unix time the newest checkpoint was committed
        self.checkpoints_written = 0
        # As of the last progress line (status, metrics); None until the first.
        self.tokens_per_second: float | None = None
        self.seconds_per_step: float | None = None
        self.lr: float | None = None
        # (step, monotonic time, tokens) when this life started: the summary's and ETA's baseline.
        self._started = (0, time.monotonic(), 0)
        self.prometheus = None  # rank 0's metrics exposition, made by resume() when configured
        self.last_write_seconds = 0.0
        self.last_stall_seconds = 0.0
        # Built by build()/resume(); status() may run before (it is served once the socket is bound).
        self._lock: IO[bytes] | None = None
        self.control: ControlServer | None = None
        self.device: torch.device | None = None
        self.deterministic = False
        self.numerics: NumericMode | None = None
        self.local_batch = 0
        self.arms: list[Arm] = []
        self.streams: list[ArmStream] = []
        self.mixture: FixedMixture | None = None
        self.arm_index: dict[str, int] = {}
        self.model: GPT | None = None
        #: What a step calls: the model, or its DDP wrapper in a job.
        self.forward: torch.nn.Module | None = None
        self.params: list[torch.nn.Parameter] = []
        self.layout: list[LayoutEntry] = []
        self.fused = True
        self.optimizer: torch.optim.AdamW | None = None
        self._staging: StagingBuffer | None = None
        self.ckpt: CheckpointManager | None = None
        self.losslog: LossLog | None = None
        self.link: ProxyLink | None = None
        self._pending_rng: RngState | None = None
        self._snapshot_env: Environment | None = None  # fixed for the life of the process
        self._unlogged: LossEntry | None = None
        self._window = [time.perf_counter(), 0, 0]  # progress line: start, tokens, steps
        self._wait_since: float | None = None
        self._next_report = 0.0
        self.evallog: EvalLog | None = None
        self.evaluator: Evaluator | None = None
        self.eval_every: int | None = None
        self.compiled: bool | None = None
        self.last_eval: EvalEntry | None = None
        self.last_eval_step = 0
        self.eval_seconds = 0.0
        self._resume_eval_due = False

    # ---- setup ------------------------------------------------------------------------------

    def setup(self) -> None:
        """`build`, then `resume` (a single process; a job agrees on `build`'s outcome between)."""
        self.build()
        self.resume()

    def build(self, device: torch.device | None = None) -> None:
        """Build data, model and optimizer on `device` (default: the config's). Raises
        InterruptedError (a stop during start-up), DataError or AlreadyRunning."""
        cfg = self.cfg
        if self.main:
            self._lock = claim(self.run_dir, "trainer")
            self.control = ControlServer(
                endpoint(self.run_dir, "trainer"), self.flags, self.status, self.holds
            )
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = device if device is not None else resolve_device(cfg.device)
        self.deterministic = determinism.resolve(cfg.deterministic, self.device)
        determinism.apply(self.deterministic)
        self.numerics = resolve_precision(cfg.precision, self.device)
        self.numerics.apply()
        if cfg.batch_size % self.world.size:
            raise ConfigError(
                f"batch_size {cfg.batch_size} (sequences per step over the whole job) is not divisible "
                f"by the world size {self.world.size}"
            )
        self.local_batch = cfg.batch_size // self.world.size
        self.arms = load_arms(
            cfg.data, self.run_dir, cfg.model.vocab_size, self.flags.stop_requested
        )
        self.streams = [ArmStream(a, cfg.seed, cfg.model.block_size) for a in self.arms]
        self.mixture = FixedMixture(
            [a.name for a in self.arms], [s.weight for s in cfg.data.arms], cfg.seed
        )
        self.arm_index = {a.name: i for i, a in enumerate(self.arms)}

        # Seed everything for a fresh run; a resumed run overwrites all of it from the manifest.
        torch.manual_seed(cfg.seed)
        np.random.seed(cfg.seed % 2**32)
        random.seed(cfg.seed)
        self.model = GPT(cfg.model).to(self.device)
        if self.world.rank:
            # Same initial weights everywhere (DDP also broadcasts rank 0's), but each rank's own
            # random stream afterwards: identical dropout masks on every rank would waste the data.
            rank_seed = int(
                np.random.SeedSequence([cfg.seed, self.world.rank]).generate_state(1)[0]
            )
            torch.manual_seed(rank_seed)
            np.random.seed(rank_seed)
            random.seed(rank_seed)
        self.compiled = cfg.compile == "on" or (
            cfg.compile == "auto" and self.device.type == "cuda"
        )
        self.params = [p for _, p in self.model.named_parameters()]
        self.layout = layout_of((n, tuple(p.shape)) for n, p in self.model.named_parameters())
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.model.decay_groups(o.weight_decay),
            lr=o.lr,
            betas=(o.beta1, o.beta2),
            eps=o.eps,
            fused=True,
        )
        self.forward = self.model
        if self.main:
            self._staging = StagingBuffer(sum(p.numel() for p in self.params), self.device)
            self.ckpt = CheckpointManager(
                self.run_dir, cfg.checkpoint, read_buffer=self._staging.array
            )

    def resume(self) -> None:
        """Rank 0 finds the newest valid checkpoint; every rank restores it (weights, m and v from
        rank 0, its own RNG and cursors from the manifest); then the proxy link or loss log is
        opened. Raises ResumeRefused on every rank when rank 0 refuses."""
        cfg = self.cfg
        manifest, payload = self._find_checkpoint()
        prior_segment = 0
        if manifest is not None:
            self._restore(manifest, payload)
            prior_segment = manifest.progress.segment
            if manifest.config_hash != cfg.trajectory_hash():
                if self.main:
                    log.warning(
                        "resuming under a changed training config, on purpose "
                        "(--allow-config-change): %s",
                        "; ".join(config_changes(trajectory_of(manifest.config), cfg.trajectory()))
                        or "data identities changed",
                    )
                self.config_changed = True
        if self.main and self.opts.config_changes:
            record_trajectory(cfg, self.run_dir / CONFIG_FILE)
            log.warning(
                "config change accepted on purpose (--allow-config-change) and recorded in %s: %s",
                CONFIG_FILE,
                "; ".join(self.opts.config_changes),
            )
        if self.world.distributed:
            from torch.nn.parallel import DistributedDataParallel

            states = [self.optimizer.state[p] for p in self.params] if manifest is not None else []
            dist.broadcast_tensors(
                self.world,
                [s["exp_avg"] for s in states] + [s["exp_avg_sq"] for s in states],
            )
            # Broadcasts rank 0's parameters to every rank as it is built.
            self.forward = DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if self.device.type == "cuda" else None,
                gradient_as_bucket_view=True,
            )
        if self.compiled:
            # Evaluation and sampling run the plain model (eval mode would only add a second
            # compiled graph); the compiled module shares its parameters.
            self.forward = torch.compile(self.forward)
        self.phase = manifest.mixing.phase if manifest is not None else 0
        self._setup_evaluation(manifest)
        if self.main and cfg.mixing == "fixed":
            loss_path = self.run_dir / LOSS_FILE
            tail = last_entry(loss_path) if loss_path.exists() else None
            self.segment = max(prior_segment, tail.segment if tail else 0) + 1
            self.losslog = LossLog.open(loss_path)
            self.evallog = EvalLog.open(self.run_dir / EVAL_FILE)
        elif self.main:
            # The proxy owns .loss.json and numbers the segments (it sees every life's records).
            self.link = ProxyLink(
                peer_endpoint(self.run_dir, "proxy"),
                self.step,
                cfg.seed,
                [a.name for a in self.arms],
            )
            for entry in manifest.pending_losses if manifest is not None else []:
                self.link.submit_loss(entry)
            for record in manifest.pending_evals if manifest is not None else []:
                self.link.submit_eval(record)
            self.link.start()
        self._started = (self.step, time.monotonic(), self.tokens_seen)
        self.prometheus = (
            exposition_for(cfg.metrics, "trainer", self.run_dir) if self.main else None
        )
        self._pending_rng = None
        if manifest is not None:
            self._pending_rng = (
                manifest.distributed.ranks[self.world.rank].rng
                if manifest.distributed is not None
                else manifest.rng
            )
        if self.main:
            log.info("%s", schedule.describe(cfg.optim))
            if (why := schedule.disagreement(cfg.optim, cfg.max_steps)) is not None:
                log.warning("%s", why)
            log.info(
                "model %s: %s parameters on %s, %s, %d threads%s; %s mixing; world size %d, "
                "batch %d per step (%d per rank); starting at step %d",
                cfg.preset,
                f"{self.model.n_params():,}",
                self.device,
                self.numerics.recorded,
                torch.get_num_threads(),
                ", deterministic" if self.deterministic else "",
                cfg.mixing,
                self.world.size,
                cfg.batch_size,
                self.local_batch,
                self.step,
            )

    def _find_checkpoint(self) -> tuple[Manifest | None, fmt_Payload | None]:
        """Rank 0 discovers and verifies; the other ranks receive its manifest (or its refusal)."""
        loaded: Loaded | None = None
        refusal: str | None = None
        if self.main:
            try:
                loaded = self.ckpt.load(self._expectation())
            except ResumeRefused as e:
                if not self.world.distributed:
                    raise
                refusal = str(e)
        if not self.world.distributed:
            return (loaded.manifest, loaded.payload) if loaded is not None else (None, None)
        message = None
        if self.main:
            message = json.dumps(
                {"refused": refusal}
                if refusal is not None
                else {"manifest": loaded.manifest.model_dump(mode="json") if loaded else None}
            ).encode()
        answer = json.loads(dist.broadcast_bytes(self.world, message))
        if answer.get("refused") is not None:
            raise ResumeRefused(answer["refused"])
        if self.main:
            for reason in loaded.skipped if loaded is not None else []:
                log.warning("skipped damaged checkpoint %s", reason)
            return (loaded.manifest, loaded.payload) if loaded is not None else (None, None)
        m = answer["manifest"]
        return (Manifest.model_validate(m), None) if m is not None else (None, None)

    def _expectation(self) -> Expectation:
        return Expectation(
            model=self.cfg.model,
            layout=self.layout,
            data_identities={a.name: a.identity for a in self.arms},
            config_hash=self.cfg.trajectory_hash(),
            allow_config_change=self.opts.allow_config_change,
            trajectory=self.cfg.trajectory(),
            world_size=self.world.size,
            check=self._cursor_problems,
        )

    def _cursor_problems(self, m: Manifest) -> list[str]:
        """Cursors a resume could not take (an arm's chunk count differs from the data's)."""
        sizes = {s.arm.name: s.n_chunks for s in self.streams}
        return [
            f"arm {c.name!r}: cursor written for {c.n_chunks} chunks, the arm has {sizes[c.name]}"
            for c in m.data
            if c.name in sizes and c.n_chunks != sizes[c.name]
        ]

    def _setup_evaluation(self, manifest: Manifest | None) -> None:
        cfg = self.cfg
        every = cfg.eval.every if cfg.eval.every is not None else cfg.checkpoint.every
        self.evaluator = Evaluator(
            self.arms, cfg.model.block_size, cfg.eval.sequences, cfg.batch_size, self.device
        )
        if not cfg.data.heldout_fraction:
            log.info(
                "this run has no held-out split (heldout_fraction unset: the run predates splits, "
                "or 0): no held-out evaluation"
            )
            every = 0
        elif not self.evaluator:
            log.warning("no arm has held-out data for even one sequence: no held-out evaluation")
            every = 0
        self.eval_every = every
        if manifest is not None:
            self.last_eval_step = manifest.last_eval_step
            # A stop that interrupted the evaluation of the checkpointed step: do it first.
            self._resume_eval_due = bool(
                every and self.step % every == 0 and self.last_eval_step < self.step
            )

    def _restore(self, m: Manifest, p: fmt_Payload | None) -> None:
        """Restore from manifest `m` and payload `p`; without a payload (ranks other than 0 of a
        job), Adam's state is created with the right step count and filled by a broadcast."""
        if self.main:
            self._warn_if_inexact(m)
        if p is None:
            # The moments' shapes and step count only; a broadcast from rank 0 fills them.
            n = m.n_params
            zeros = np.zeros(n, dtype=np.float32)
            p = fmt_Payload(m.step, n, zeros, zeros, zeros)
        else:
            load_weights(list(self.model.named_parameters()), m.layout, p.weights)
        load_adam_state(self.optimizer, self.params, m.layout, p, m.optimizer.adam_step)
        if "cursor" not in self.opts.skip_restore:
            mine = (
                m.distributed.ranks[self.world.rank].data if m.distributed is not None else m.data
            )
            cursors = {c.name: c for c in mine}
            for s in self.streams:
                saved = cursors.get(s.arm.name)
                if saved is not None and saved.identity == s.arm.identity:
                    s.load_state_dict(saved)
                else:
                    # Only reachable with --allow-config-change (the resume check refuses it
                    # otherwise): an added arm, or one whose data changed, starts at its beginning.
                    log.warning(
                        "arm %r %s: its cursor starts at the beginning",
                        s.arm.name,
                        "is new" if saved is None else "has changed data",
                    )
        self.step = self.last_saved = m.step
        if self.main:  # the other ranks of a job may not see the run directory
            self.last_saved_at = (self.run_dir / m.bin_file).stat().st_mtime
        self.tokens_seen = m.progress.tokens_seen
        self.train_seconds = m.progress.train_seconds
        if self.main:
            log.info(
                "resumed from %s (trigger %s, written %s)", m.bin_file, m.trigger, m.created_utc
            )

    def _environment(self) -> Environment:
        return Environment(
            device=str(self.device),
            dtype=self.numerics.recorded,
            threads=torch.get_num_threads(),
            torch_version=torch.__version__,
            numpy_version=np.__version__,
            python_version=platform.python_version(),
            code_version=code_version(),
            world_size=self.world.size,
            deterministic=self.deterministic,
            **cudaenv.describe(self.device),
            compiled=self.compiled,
        )

    #: Environment fields whose change makes a resume inexact (the versions of Python, NumPy and
    #: the code are recorded for the audit: they do not change the arithmetic of a step).
    EXACTNESS_FIELDS = (
        "device",
        "dtype",
        "threads",
        "torch_version",
        "compiled",
        "deterministic",
        "gpu",
        "compute_capability",
        "cuda_driver",
        "cuda_runtime",
        "cudnn",
        "nccl",
    )

    def _warn_if_inexact(self, m: Manifest) -> None:
        then, now = m.environment.model_dump(), self._environment().model_dump()
        changed = [f"{k}: {then[k]} → {now[k]}" for k in self.EXACTNESS_FIELDS if then[k] != now[k]]
        if changed:
            log.warning(
                "this resume will NOT be bit-exact with the run so far (%s)", "; ".join(changed)
            )

    # ---- one step ---------------------------------------------------------------------------

    def train_step(self, arm: int) -> tuple[float, LossEntry | None]:
        """One optimizer step: `grad_accum` micro-batches of the step's arm, their gradients
        averaged, each on this rank's share of the micro-batch's global batch. Returns this rank's
        loss (the mean over its micro-batches) and on rank 0 the step's record (whose loss
        `_record` replaces by the mean over ranks). Nothing in it checks a signal: a step is never
        cut short."""
        step = self.step + 1
        accum = self.cfg.grad_accum
        lr = lr_at(step, self.cfg.optim)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        sha = hashlib.sha256()
        losses = []
        n_tokens = 0
        r = self.world.rank
        started = time.perf_counter()
        extended = False
        for i in range(accum):
            if i and not extended and self.flags.stop_requested():
                # A stop waits for the whole step: ask systemd for the rest of it (at the pace
                # of the micro-batches so far, doubled) on top of the final checkpoint's time.
                extended = True
                per_micro = (time.perf_counter() - started) / i
                self.notifier.extend_timeout(
                    2 * per_micro * (accum - i) + max(30.0, 4 * self.last_write_seconds)
                )
            # Every rank draws the whole global batch's chunks (only indices and a gather of
            # tokens), so the cursors advance alike everywhere and the digest names the global
            # batch; each rank trains on its own contiguous rows of it.
            batch = self.streams[arm].next_batch(self.cfg.batch_size)
            sha.update(batch.tobytes())
            rows = batch[r * self.local_batch : (r + 1) * self.local_batch]
            xy = torch.from_numpy(rows).to(self.device, non_blocking=True)
            # In a job, DDP all-reduces (averages) the gradients in the last backward only.
            sync = (
                contextlib.nullcontext()
                if i == accum - 1 or not self.world.distributed
                else self.forward.no_sync()
            )
            with sync:
                with (
                    self.numerics.autocast(self.device),
                    determinism.attention(self.deterministic, self.device),
                ):
                    _, loss = self.forward(xy[:, :-1], xy[:, 1:])
                # The mean over micro-batches of equal size is the loss of the step's batch.
                (loss / accum if accum > 1 else loss).backward()
            losses.append(loss.detach())
            n_tokens += batch.shape[0] * (batch.shape[1] - 1)
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.grad_clip, foreach=True)
        self.optimizer.step()
        self.step = step
        self.tokens_seen += n_tokens
        value = (losses[0] if accum == 1 else torch.stack(losses).mean()).item()
        digest = sha.hexdigest()
        if not self.main:
            return value, None
        return value, LossEntry(
            step=step,
            loss=value,
            arm=self.arms[arm].name,
            lr=lr,
            tokens=n_tokens,
            wall_time=time.time(),
            segment=self.segment,
            phase=self.phase,
            batch_sha256=digest,
        )

    # ---- checkpoints ------------------------------------------------------------------------

    def _collect(self) -> list[RankState] | None:
        """Every rank, at an agreed checkpoint point: check that the replicas agree, and gather
        each rank's RNG and cursor states to rank 0 (None on the other ranks and for a single
        process). DistributedError on every rank when the replicas diverged."""
        if not self.world.distributed:
            return None
        states = [self.optimizer.state[p] for p in self.params]
        dist.check_replicas(
            self.world,
            {
                "weights": self.params,
                "m": [s["exp_avg"] for s in states],
                "v": [s["exp_avg_sq"] for s in states],
            },
        )
        mine = RankState(
            rank=self.world.rank,
            rng=rngstate.capture(self.device),
            data=[s.state_dict() for s in self.streams],
        )
        got = dist.gather_bytes(self.world, mine.model_dump_json().encode())
        return [RankState.model_validate_json(b) for b in got] if got is not None else None

    def snapshot(self, ranks: list[RankState] | None = None) -> Snapshot:
        """The state after the current step, copied into the preallocated host buffer (pinned on
        CUDA, where the copies are asynchronous and `Snapshot.ready` waits for them). `ranks`: every
        rank's states, gathered by `_collect` (rank 0 of a job).

        Waits first for a background write in flight: it is reading that buffer."""
        self._wait_for_write()
        states = [self.optimizer.state[p] for p in self.params]
        adam_steps = {int(x) for x in torch.stack([s["step"] for s in states]).tolist()}  # one sync
        if len(adam_steps) != 1:
            raise RuntimeError(f"parameters disagree on Adam's step count: {sorted(adam_steps)}")
        payload = self._staging.fill(
            self.step,
            self.params,
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
        )
        o = self.cfg.optim
        if self._snapshot_env is None:
            self._snapshot_env = self._environment()
        fields = dict(
            layout=self.layout,
            model=self.cfg.model,
            optimizer=OptimizerState(
                betas=(o.beta1, o.beta2),
                eps=o.eps,
                weight_decay=o.weight_decay,
                grad_clip=o.grad_clip,
                fused=self.fused,
                adam_step=adam_steps.pop(),
            ),
            scheduler=scheduler_state(self.step, o),
            rng=ranks[0].rng if ranks else rngstate.capture(self.device),
            data=[s.state_dict() for s in self.streams],
            mixing=MixingState(
                mode=self.cfg.mixing, phase=self.phase, arms=[a.name for a in self.arms]
            ),
            pending_losses=[e for e in self.link.unacknowledged() if e.step <= self.step]
            if self.link
            else [],
            last_eval_step=self.last_eval_step,
            pending_evals=[e for e in self.link.unacknowledged_evals() if e.step <= self.step]
            if self.link
            else [],
            progress=Progress(
                step=self.step,
                tokens_seen=self.tokens_seen,
                segment=self.segment,
                train_seconds=self.train_seconds,
            ),
            environment=self._snapshot_env,
            config_hash=self.cfg.trajectory_hash(),
            config=self.cfg.model_dump(mode="json"),
            distributed=DistributedState(
                world_size=self.world.size, backend=self.backend or "?", ranks=ranks
            )
            if ranks
            else None,
        )
        return Snapshot(
            step=self.step,
            fields=fields,
            payload=payload,
            ready=self._staging.ready,
        )

    def _sync_losses(self) -> None:
        # The loss history reaches the disk no later than the weights: called by the checkpoint
        # manager between the payload and the manifest (the commit), on the writer's thread for a
        # background write (an fsync of the log's descriptor; the main thread only appends).
        if self.losslog is not None:
            try:
                self.losslog.sync()
            except LossLogError as e:  # an append failed: this checkpoint must not commit
                raise OSError(f"{LOSS_FILE} is not durable: {e}") from e
        if self.evallog is not None:
            try:
                self.evallog.sync()
            except LossLogError as e:
                raise OSError(f"{EVAL_FILE} is not durable: {e}") from e

    def _wait_for_write(self) -> None:
        """Block until no background checkpoint write is in flight (rank 0; others never write)."""
        if self.main:
            self.ckpt.wait()

    def checkpoint(self, trigger: Trigger, ranks: list[RankState] | None = None) -> None:
        """Write a checkpoint of the current step, durably, before returning (after a background
        write in flight, if any, has finished). Rank 0 only."""
        t0 = time.perf_counter()
        manifest = self.ckpt.save(self.snapshot(ranks), trigger, before_commit=self._sync_losses)
        self.last_saved = self.step
        self.config_changed = False
        self.last_saved_at = time.time()
        self.checkpoints_written += 1
        self.last_write_seconds = time.perf_counter() - t0
        log.info(
            "checkpoint %s written (%s, %.1f MB, %.2f s)",
            manifest.bin_file,
            trigger,
            manifest.bin_size / 1e6,
            self.last_write_seconds,
        )

    def _checkpoint_in_background(self, trigger: Trigger, ranks: list[RankState] | None) -> None:
        """Stage the current step's state (the only part training waits for), then write and fsync
        it on the writer thread while training continues. A write still in flight is waited for
        first: a cadence checkpoint is delayed, never skipped."""
        t0 = time.perf_counter()
        snap = self.snapshot(ranks)
        step = snap.step

        def done(manifest: Manifest | None, error: BaseException | None, seconds: float) -> None:
            # On the writer's thread. last_saved moves only once the manifest is committed.
            if manifest is not None:
                self.last_saved = max(self.last_saved, step)
                self.last_saved_at = time.time()
                self.checkpoints_written += 1
                self.last_write_seconds = seconds
                log.info(
                    "checkpoint %s written (%s, %.1f MB, %.2f s in the background)",
                    manifest.bin_file,
                    trigger,
                    manifest.bin_size / 1e6,
                    seconds,
                )
            elif isinstance(error, OSError):
                log.error(
                    "checkpoint of step %d (%s) FAILED: %s; training continues, newest valid is step %s",
                    step,
                    trigger,
                    error,
                    self.last_saved or "none",
                )
            else:
                log.error(
                    "checkpoint of step %d (%s) FAILED unexpectedly: %r", step, trigger, error
                )

        self.ckpt.save_async(snap, trigger, on_done=done, before_commit=self._sync_losses)
        self.last_stall_seconds = time.perf_counter() - t0
        log.debug(
            "checkpoint of step %d staged in %.4f s; writing in the background",
            step,
            self.last_stall_seconds,
        )

    def _cadence(self) -> None:
        """A cadence checkpoint of the current step (every rank: the step decides it)."""
        ranks = self._collect()
        if not self.main or self._unlogged is not None:
            return
        if self.cfg.checkpoint.async_write:
            self._checkpoint_in_background("cadence", ranks)
        else:
            self._write_and_continue("cadence", ranks)

    def _write_and_continue(self, trigger: Trigger, ranks: list[RankState] | None) -> None:
        # Requested checkpoints are synchronous: whoever asked is told once it is durable. A
        # background write of this very step that was in flight serves the request.
        # A failed write mid-run (disk full, say) must not end a multi-day run: the previous
        # checkpoint stays valid, the error is logged, and the next cadence point tries again.
        self._wait_for_write()
        if self.last_saved == self.step:
            self.ckpt.mark_requested(self.step, trigger)
            log.info(
                "checkpoint of step %d already written; kept as requested (%s)", self.step, trigger
            )
            return
        try:
            with self.notifier.keepalive(f"writing checkpoint of step {self.step} ({trigger})"):
                self.checkpoint(trigger, ranks)
        except OSError as e:
            log.error(
                "checkpoint of step %d (%s) FAILED: %s; training continues, newest valid is step %s",
                self.step,
                trigger,
                e,
                self.last_saved or "none",
            )

    def _on_checkpoint_request(self, reason: Trigger) -> None:
        """An agreed checkpoint request (every rank calls it at the same step boundary)."""
        if self.step == 0:
            if self.main:
                log.warning(
                    "checkpoint requested (%s) before the first step: there is nothing to save yet",
                    reason,
                )
                self.control.checkpoint_served(
                    {"step": 0}, error="nothing trained yet: there is no step to checkpoint"
                )
            return
        ranks = self._collect()
        if not self.main:
            return
        if self._unlogged is not None:
            self.control.checkpoint_served(
                {"step": self.step},
                error=f"the loss of step {self.step} could not be written; no checkpoint of it",
            )
            return
        self._write_and_continue(reason, ranks)
        if self.last_saved == self.step:
            self.control.checkpoint_served({"step": self.step, "checkpoint": bin_name(self.step)})
        else:
            self.control.checkpoint_served(
                {"step": self.step},
                error=f"checkpoint of step {self.step} failed (see the trainer's log)",
            )

    # ---- evaluation -------------------------------------------------------------------------

    def evaluate(self) -> EvalEntry | None:
        """Score the current weights on every arm's held-out sequences and record the result
        (the proxy's .eval.json, or the trainer's own in fixed mode). None, recording nothing,
        when a stop request interrupted it."""
        self.activity = Activity.EVALUATING
        log.info("evaluating step %d on held-out data", self.step)
        result = self.evaluator.evaluate(self.model, self.numerics, self.flags.stop_requested)
        self.notifier.tick()
        if result is None:
            log.info(
                "evaluation of step %d abandoned: stop requested (it runs again after the resume)",
                self.step,
            )
            return None
        self.eval_seconds += result.seconds
        entry = EvalEntry(
            step=self.step,
            segment=self.segment,
            phase=self.phase,
            arms={
                name: ArmEval(loss=r.loss, sequences=r.sequences, tokens=r.tokens)
                for name, r in result.losses.items()
            },
            seconds=result.seconds,
            wall_time=time.time(),
        )
        if self.evallog is not None:
            self.evallog.append(entry)
        else:
            self.link.submit_eval(entry)
        self.last_eval, self.last_eval_step = entry, self.step
        log.info(
            "held-out loss at step %d: mean %.4f | %s | %.2f s (%.1f%% of training time so far)",
            self.step,
            entry.mean_loss(),
            " | ".join(f"{n} {a.loss:.4f}" for n, a in entry.arms.items()),
            result.seconds,
            100 * self.eval_seconds / max(self.train_seconds, 1e-9),
        )
        return entry

    # ---- samples ----------------------------------------------------------------------------

    def sample(self) -> list[str]:
        """Generate from fixed prompts with a generator of its own, seeded by (seed, step), so that
        auditing never draws from the RNGs that training uses."""
        g = torch.Generator(device=self.device)
        g.manual_seed((self.cfg.seed * 1_000_003 + self.step) % 2**63)
        out = []
        for prompt in SAMPLE_PROMPTS:
            idx = torch.tensor([list(prompt.encode())], dtype=torch.long, device=self.device)
            with self.numerics.autocast(self.device):
                toks = self.model.generate(
                    idx, self.cfg.sample_tokens, g, should_stop=self.flags.stop_requested
                )
            out.append(bytes(toks[0].tolist()).decode("utf-8", errors="replace"))
        return out

    def _samples(self) -> None:
        log.info("generating samples at step %d", self.step)
        texts = self.sample()
        for text in texts:
            log.info("sample at step %d: %r", self.step, text)
        if self.link is not None:
            self.link.submit_samples(
                m.SampleReport(
                    id=new_id(),
                    step=self.step,
                    segment=self.segment,
                    phase=self.phase,
                    samples=[m.Sample(prompt=p, text=t) for p, t in zip(SAMPLE_PROMPTS, texts)],
                )
            )

    # ---- status -----------------------------------------------------------------------------

    def status(self) -> TrainerStatus:
        """What `andreactl status` shows; read from the control thread, so only plain values.
        Served by global rank 0: `pid` is rank 0's (the process SIGUSR1 checkpoints through), and
        in a job `agent_pid` is torchrun's (the process a stop may be sent to)."""
        return TrainerStatus(
            pid=os.getpid(),
            world_size=self.world.size,
            agent_pid=os.getppid() if self.world.distributed else None,
            activity=self.activity,
            step=self.step,
            max_steps=self.cfg.max_steps,
            loss_ema=self.loss_ema,
            last_checkpoint=self.last_saved or None,
            segment=self.segment,
            phase=self.phase,
            mixing=self.cfg.mixing,
            proxy_connected=self.link.connected() if self.link is not None else None,
            preset=self.cfg.preset,
            run_dir=str(self.run_dir),
            device=str(self.device) if self.device is not None else None,
            dtype=self.numerics.recorded if self.numerics is not None else None,
            checkpoint_every=self.cfg.checkpoint.every,
            hold=self.holds.describe(),
            **self._progress_status(),
            grad_accum=self.cfg.grad_accum,
            compiled=self.compiled,
            eval_every=self.eval_every,
            last_eval=self.last_eval,
        )

    def _progress_status(self) -> dict[str, float | None]:
        """Throughput, LR, elapsed time, ETA and checkpoint age, as of the last progress line."""
        spp = self.seconds_per_step
        return {
            "tokens_per_second": self.tokens_per_second,
            "lr": self.lr,
            "elapsed_seconds": time.monotonic() - self._started[1],
            "eta_seconds": None if spp is None else eta_seconds(self.step, self.cfg.max_steps, spp),
            "last_checkpoint_age_seconds": None
            if self.last_saved_at is None
            else time.time() - self.last_saved_at,
        }

    # ---- mixing -----------------------------------------------------------------------------

    def _arm_for(self, step: int) -> int | None:
        """This rank's view of the arm of `step`: the fixed mixture's (every rank), or the proxy's
        assignment if it arrives within 0.25 s (rank 0; None otherwise). Rank 0's is agreed."""
        if self.link is None:
            return self.mixture.assign(step) if self.cfg.mixing == "fixed" else None
        a = self.link.assignment(step, timeout=0.25)
        if a is None:
            return None
        self.segment = self.link.segment
        self.phase = a.phase
        return self.arm_index[a.arm]

    def _waiting_for_proxy(self, step: int) -> None:
        """Rank 0, while no rank can train `step` because the proxy has not assigned it."""
        if not self.main:
            return
        now = time.monotonic()
        if self._wait_since is None:
            self._wait_since, self._next_report = now, now + 2.0
        self.activity = Activity.WAITING_FOR_PROXY
        if now >= self._next_report:
            waited = now - self._wait_since
            log.warning("waiting for the proxy to assign step %d (%.0f s so far)", step, waited)
            self.notifier.status(f"step {self.step}: waiting for proxy ({waited:.0f} s)")
            self._next_report += 10.0
        self.notifier.tick()

    def _hold(self) -> None:
        """Wait at a boundary checkpoint until resumed (the proxy pivots meanwhile), honouring stop
        and checkpoint requests; every rank holds, agreeing every 50 ms. On resume every
        prefetched arm is dropped: it was drawn under the old policy."""
        hold = self.holds.due() if self.main else None
        if hold is not None and not self.holds.begin(hold.id, self.step):
            hold = None
        acknowledged = self.link is None
        if self.main:
            self.activity = Activity.HOLDING
            self._publish_metrics(force=True)
            self.notifier.status(f"step {self.step}: holding at a boundary checkpoint")
            log.info(
                "holding after the checkpoint of step %d (hold %s) until resumed",
                self.step,
                hold.id if hold is not None else "-",
            )
            if acknowledged:
                self.holds.mark_acknowledged()
        while True:
            if self.main and not acknowledged and self.link is not None:
                # Ready for the pivot once the proxy has every record up to this step, the
                # boundary's sample included.
                acknowledged = self.link.wait_acknowledged(timeout=0.0)
                if acknowledged:
                    self.holds.mark_acknowledged()
            if hold is not None and self.holds.expired(hold.id):
                log.warning(
                    "hold %s: no resume within %.0f s of holding after step %d; continuing under "
                    "the proxy's current phase (a pivot the proxy made meanwhile still applies)",
                    hold.id,
                    hold.timeout_s,
                    self.step,
                )
                self.holds.drop(hold.id)
                self.flags.request_resume()
            d = self.coord.agree(self.flags, holding=True)
            if d.checkpoint is not None:
                self._on_checkpoint_request(d.checkpoint)
            if d.stop is not None:
                return
            if d.resume:
                if hold is not None:
                    self.holds.take_release(hold.id)
                if self.link is not None:
                    self.link.restart_after(self.step)
                if self.main:
                    log.info("resumed after step %d", self.step)
                return
            self.notifier.tick()
            time.sleep(0.05)

    def _follow_pivot(self) -> bool:
        """Roll back to a pivot's boundary if the proxy started a phase whose first step this
        trainer already trained under an older phase (the manual pivot while it ran ahead, or a
        resume from a checkpoint of the old phase). True when it rolled back. A single process
        only: a torchrun job refuses a manual pivot it ran past (see docs/operations.md)."""
        if self.link is None:
            return False
        target = self.link.rollback_target(self.step, self.phase)
        if target is None:
            return False
        phase, boundary = target
        log.warning(
            "the proxy started phase %d after step %d, but this trainer trained up to step %d under "
            "phase %d: rolling back to %s (the steps after it stay in .loss.json as superseded)",
            phase,
            boundary,
            self.step,
            self.phase,
            bin_name(boundary),
        )
        self._wait_for_write()
        # Raises ResumeRefused when the boundary checkpoint is gone or damaged: the trainer cannot
        # follow the pivot, and says so (exit 4) rather than training on under the old phase.
        try:
            loaded = self.ckpt.load(self._expectation(), step=boundary)
        except ResumeRefused as e:
            raise ResumeRefused(
                f"cannot follow the proxy's pivot after step {boundary}: {e}"
            ) from None
        self._restore(loaded.manifest, loaded.payload)
        self.phase = loaded.manifest.mixing.phase
        rngstate.restore(loaded.manifest.rng, self.device)
        # A pivot boundary is an audit point: retention keeps it like `andreactl pivot`'s.
        if loaded.manifest.trigger not in REQUESTED_TRIGGERS:
            self.ckpt.mark_requested(boundary, "boundary")
        self.link.restart_after(boundary, new_segment=True)
        return True

    # ---- the loop ---------------------------------------------------------------------------

    def _at_boundary(self, step: int) -> bool:
        every = self.cfg.checkpoint.every
        return every == 0 or step % every == 0

    def _record(self, entry: LossEntry | None, mean_loss: float | None) -> None:
        """Rank 0: log the step's record, with the loss averaged over the ranks."""
        self.activity = Activity.TRAINING
        self._wait_since = None
        if entry is None:
            return
        if self.world.distributed and mean_loss is not None:
            entry = entry.model_copy(update={"loss": mean_loss})
        self.loss_ema = ema_update(self.loss_ema, entry.loss)
        if self.losslog is not None:
            try:
                self.losslog.append(entry)
            except OSError as e:
                # The step is trained but its loss is not on disk: it must not be checkpointed
                # without it (finish tries once more on a reopened log).
                log.error("cannot append the loss of step %d to %s: %s", self.step, LOSS_FILE, e)
                self._unlogged = entry
                self.flags.request_stop("disk-full")
                return
        else:
            self.link.submit_loss(entry)
        self.notifier.tick()
        w = self._window
        w[1] += entry.tokens
        w[2] += 1
        cfg = self.cfg
        if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
            elapsed = time.perf_counter() - w[0]
            self.tokens_per_second = w[1] / elapsed
            self.seconds_per_step = elapsed / w[2]
            self.lr = entry.lr
            eta = format_duration(eta_seconds(self.step, cfg.max_steps, self.seconds_per_step))
            ema = float("nan") if self.loss_ema is None else self.loss_ema
            log.info(
                "step %d/%d | loss %.4f (ema %.4f) | lr %.2e | %s | %.0f tok/s | %.1f ms/step"
                " | ETA %s | last ckpt %s",
                self.step,
                cfg.max_steps,
                entry.loss,
                ema,
                entry.lr,
                entry.arm,
                self.tokens_per_second,
                1000 * self.seconds_per_step,
                eta,
                self.last_saved or "none",
                extra=journal_fields(self.step, entry.loss, entry.lr, entry.arm, self.phase),
            )
            self.notifier.status(f"step {self.step}/{cfg.max_steps} loss {ema:.4f} ETA {eta}")
            self._publish_metrics()
            self._window = [time.perf_counter(), 0, 0]

    def run(self) -> ExitCode:
        """Train until max_steps or an agreed stop; always leave the newest state checkpointed.

        At each step boundary every rank takes part in one agreement (`Coordinator.agree`) that
        carries the loss of the step just trained, any rank's stop or checkpoint request, and the
        arm of the next step; everything after it is the same on every rank."""
        cfg = self.cfg
        if self._pending_rng is not None and "rng" not in self.opts.skip_restore:
            try:
                notes = rngstate.restore(self._pending_rng, self.device)
            except (RuntimeError, ValueError) as e:
                # The same checkpoint fails the same way at every start: the operator must
                # decide, a restart cannot.
                raise ResumeRefused(
                    f"cannot restore the random generators of step {self.step}'s checkpoint: {e}"
                ) from e
            for note in notes:
                log.warning("this resume will NOT be bit-exact with the run so far: %s", note)
        self.notifier.ready(f"step {self.step}/{cfg.max_steps}")
        self._window = [time.perf_counter(), 0, 0]
        self._wait_since: float | None = None
        settled = self.step  # the newest step whose cadence, boundary and samples are done
        trained: tuple[float, LossEntry | None] | None = None
        while True:
            if not self.world.distributed and self._follow_pivot():
                settled = self.step
                continue
            fresh = self.step > settled
            arm = self._arm_for(self.step + 1) if self.step < cfg.max_steps else None
            d = self.coord.agree(
                self.flags,
                at_boundary=fresh and self._at_boundary(self.step),
                arm=arm,
                loss=trained[0] if trained is not None else None,
            )
            if trained is not None:
                self._record(trained[1], d.loss)
                trained = None
            if self._unlogged is not None and not self.world.distributed:
                break  # no checkpoint of a step whose loss is not on disk; finish retries it
            if (ignored := self.flags.take_ignored_signal()) is not None:
                log.info("%s received and ignored (see docs/operations.md)", ignored)
            # In a job the stop for an unlogged loss reaches the other ranks with the next
            # agreement; until then rank 0 takes part in checkpoints but writes none.
            worked = self._unlogged is not None
            if fresh:
                settled = self.step
                if self.main and self.eval_every and self.step % self.eval_every == 0:
                    # Before the cadence checkpoint, so that its manifest says this step was
                    # evaluated. Rank 0 alone: the other ranks wait at the next agreement.
                    t_eval = time.perf_counter()
                    self.evaluate()
                    self._window[0] += time.perf_counter() - t_eval  # training speed only
                    self.activity = Activity.TRAINING
                # Samples first: the sample of a pivot's boundary belongs to the phase that ends
                # there, so it must reach the proxy before the hold.
                if (
                    self.main
                    and cfg.sample_every
                    and self.step % cfg.sample_every == 0
                    and not self.flags.stop_requested()
                ):
                    self._samples()
                    self._window = [time.perf_counter(), 0, 0]
                    worked = True
                if d.boundary:
                    self._on_checkpoint_request("boundary")
                    hold = self.holds.due() if self.main else None
                    if d.hold and hold is not None and self.last_saved != self.step:
                        self.holds.fail(
                            hold.id, f"the boundary checkpoint of step {self.step} failed"
                        )
                        self.flags.request_resume()
                    if d.hold:
                        self._hold()
                    worked = True
                elif cfg.checkpoint.every > 0 and self.step % cfg.checkpoint.every == 0:
                    self._cadence()
                    worked = True
            if d.checkpoint is not None:
                self._on_checkpoint_request(d.checkpoint)
                worked = True
            if d.stop is not None or self.step >= cfg.max_steps:
                break
            if worked:
                continue  # a request may have come in meanwhile: agree again before a new step
            if d.arm is None:
                self._waiting_for_proxy(self.step + 1)
                continue
            if self._resume_eval_due and self.main:
                # After the first assignment: with the proxy, that is when the segment is known.
                self._resume_eval_due = False
                if self.evaluate() is None:
                    continue
            t0 = time.perf_counter()
            trained = self.train_step(d.arm)
            self.train_seconds += time.perf_counter() - t0
        return self.finish()

    def finish(self) -> ExitCode:
        """Final checkpoint (if the newest step has none yet), then a clean exit. Every rank; the
        exit code is agreed, so that all ranks of a job end alike."""
        self.activity = Activity.STOPPING
        extend = max(30.0, 4 * self.last_write_seconds)
        if self.main and (writing := self.ckpt.in_flight()) is not None:
            # A stop during a background write waits for it (it is never abandoned half-way), then
            # writes its own final checkpoint unless that write already holds the newest step.
            log.info("waiting for the checkpoint of step %d being written", writing)
            with self.notifier.keepalive(f"finishing the checkpoint of step {writing}", extend):
                self._wait_for_write()
        reason = self.flags.stop_reason
        ranks = self._collect() if self.step > 0 else None
        code = self._final_checkpoint(reason, ranks) if self.main else ExitCode.OK
        code = ExitCode(dist.agree_code(self.world, int(code)))
        self.close()
        if self.main:
            first, started, tokens = self._started
            log.info(
                "%s",
                RunSummary(
                    first_step=first,
                    last_step=self.step,
                    wall_seconds=time.monotonic() - started,
                    tokens=self.tokens_seen - tokens,
                    loss_ema=self.loss_ema,
                    checkpoints_written=self.checkpoints_written,
                    segment=self.segment,
                    stopped_because=f"stopped at step {self.step} ({reason or 'max_steps reached'})",
                ).text(),
            )
            self._publish_metrics(force=True)
        else:
            log.info("stopped at step %d (%s)", self.step, reason or "max_steps reached")
        if self.control is not None:
            self.control.close(
                {
                    "step": self.step,
                    "exit_code": int(code),
                    "checkpoint": bin_name(self.last_saved) if self.last_saved else None,
                }
            )
        return code

    def _final_checkpoint(
        self, reason: StopReason | None, ranks: list[RankState] | None
    ) -> ExitCode:
        trigger: Trigger = reason if reason is not None else "end"
        # A checkpoint request that came with the stop is served by the final checkpoint, which
        # then counts as requested (an audit point kept by retention).
        requested = self.flags.take_checkpoint_request()
        if requested is not None and self.step > self.last_saved:
            trigger = requested
        elif requested is not None and self.step > 0:
            self.ckpt.mark_requested(self.step, requested)
        if self._unlogged is not None and not self._log_unlogged():
            log.error(
                "no final checkpoint: the loss of step %d could not be written; the newest valid"
                " checkpoint is step %s, and a restart once there is space resumes from it",
                self.step,
                self.last_saved or "none",
            )
            return ExitCode.CHECKPOINT_FAILED
        # After an accepted config change the newest checkpoint must carry the new config, or the
        # next plain restart would be refused against the old one: it is written again.
        if self.step <= self.last_saved and not (self.config_changed and self.step > 0):
            log.info("step %d is already checkpointed; nothing to write", self.step)
            return ExitCode.OK
        try:
            extend = max(30.0, 4 * self.last_write_seconds)
            with self.notifier.keepalive(f"writing final checkpoint of step {self.step}", extend):
                self.checkpoint(trigger, ranks)
        except (OSError, LossLogError) as e:
            log.error(
                "final checkpoint of step %d FAILED (%s); the newest valid checkpoint is step %s",
                self.step,
                e,
                self.last_saved or "none",
            )
            return ExitCode.CHECKPOINT_FAILED
        return ExitCode.OK

    def _publish_metrics(self, force: bool = False) -> None:
        if self.prometheus is None:
            return
        holding = self.activity in (Activity.HOLDING, Activity.WAITING_FOR_PROXY)
        self.prometheus.set(
            {
                "andrea_step": self.step,
                "andrea_max_steps": self.cfg.max_steps,
                "andrea_loss_ema": self.loss_ema,
                "andrea_tokens_per_second": self.tokens_per_second,
                "andrea_learning_rate": self.lr,
                "andrea_checkpoint_age_seconds": (
                    None if self.last_saved_at is None else time.time() - self.last_saved_at
                ),
                "andrea_holding": int(holding),
                "andrea_proxy_link_lag_steps": (
                    len(self.link.unacknowledged()) if self.link is not None else 0
                ),
                "andrea_segment": self.segment or None,
            }
        )
        self.prometheus.publish(force)

    def _log_unlogged(self) -> bool:
        """Reopen the loss log (repairing the torn append) and write the entry that failed."""
        assert self.losslog is not None and self._unlogged is not None
        try:
            self.losslog.close()
            self.losslog = LossLog.open(self.run_dir / LOSS_FILE)
            self.losslog.append(self._unlogged)
            self.losslog.sync()
        except (OSError, LossLogError) as e:
            log.error("%s is still not writable: %s", LOSS_FILE, e)
            return False
        self._unlogged = None
        return True

    def close(self) -> None:
        if not self.main:
            return
        self.ckpt.close()  # finishes a write in flight first: it syncs the loss log before committing
        if self.losslog is not None:
            self.losslog.close()
        if self.evallog is not None:
            self.evallog.close()
        if self.link is not None:
            # Unacknowledged records are in the final manifest; waiting briefly just saves a resend.
            self.link.wait_acknowledged(timeout=1.0)
            self.link.close()
