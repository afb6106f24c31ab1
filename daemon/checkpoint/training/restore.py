"""A checkpoint back into the live state, and the checks that a resume is exact.

Restore order follows the verification protocol: model and optimizer first, then the data cursors
and the progress; the random generators last, right before the first step (`restore_rng`), so
that nothing in between draws from them. In a job rank 0 discovers and verifies the checkpoint and
every other rank receives its manifest (weights, m and v follow by broadcast).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from andrea.daemon.checkpoint import rngstate
from andrea.daemon.checkpoint.format import Payload
from andrea.daemon.checkpoint.manager import CheckpointManager, Expectation, Loaded, ResumeRefused
from andrea.daemon.checkpoint.manifest import Manifest, RankState
from andrea.daemon.checkpoint.rngstate import RngState
from andrea.daemon.checkpoint.source import Source, SourceError, read_source
from andrea.daemon.checkpoint.state import load_adam_state, load_weights
from andrea.daemon.checkpoint.training.crosscheck import CrossCheck
from andrea.daemon.config import (
    RunConfig,
    config_changes,
    evaluation_changes,
    record_trajectory,
    trajectory_of,
)
from andrea.daemon.data.arms import ArmStream, CursorState
from andrea.daemon.rundir.layout import LOSS_FILE, RESOLVED_CONFIG_FILE
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.parts import seed_rank_stream
from andrea.daemon.trainer.platform import distributed as dist
from andrea.daemon.trainer.platform.environment import environment_of, inexact_changes
from andrea.protocol.lineage import Lineage, WorldSpan

log = logging.getLogger(__name__)


class Restorer:
    """Finds the checkpoint a life resumes from (or a pivot rolls back to) and restores it."""

    def __init__(self, ctx: TrainerContext, manager: CheckpointManager | None) -> None:
        """`manager`: rank 0's; None on the other ranks of a job, which receive rank 0's manifest."""
        self.ctx = ctx
        self.manager = manager
        self._pending_rng: RngState | None = None
        #: This rank has no generator states in the checkpoint (it resumes a smaller job's).
        self._fresh_stream = False
        #: Adam's moments came from a checkpoint (rank 0's reach the other ranks by broadcast).
        self.moments_restored = False
        #: What a manifest is checked against beyond its hash (the loss log read when first needed).
        self._crosscheck = CrossCheck(ctx.run_dir / LOSS_FILE, ctx.parts.streams)

    def resume(self) -> tuple[Manifest | None, bool]:
        """Restore the newest valid checkpoint, all but its random generators, and record the
        config changes accepted with --allow-config-change. Returns its manifest (None: a fresh
        run) and whether the training config differs from the one it was written with. Raises
        ResumeRefused on every rank when rank 0 refuses."""
        manifest, payload = self._find()
        changed = False
        if manifest is None:
            self._start_lineage()
        else:
            self.restore(manifest, payload)
            self.moments_restored = True
            self._continue_lineage(manifest)
            if manifest.config_hash != self.ctx.cfg.trajectory_hash():
                if self.ctx.main:
                    log.warning(
                        "resuming under a changed training config, on purpose "
                        "(--allow-config-change): %s",
                        "; ".join(
                            config_changes(
                                trajectory_of(manifest.config), self.ctx.cfg.trajectory()
                            )
                        )
                        or "data identities changed",
                    )
                changed = True
        # Accepted changes of the flags, or of the person's run.toml (which the checkpoint's own
        # check names): the record takes them in, so that a plain restart runs under them.
        if self.ctx.main and (self.ctx.opts.config_changes or changed):
            record_trajectory(self.ctx.cfg, self.ctx.opts.run_dir, self.ctx.opts.user_config)
        if self.ctx.main and self.ctx.opts.config_changes:
            log.warning(
                "config change accepted on purpose (--allow-config-change) and recorded in %s: %s",
                RESOLVED_CONFIG_FILE,
                "; ".join(self.ctx.opts.config_changes),
            )
        return manifest, changed

    def _start_lineage(self) -> None:
        """A new run's lineage: this world size from the start, and the checkpoint of another run
        it starts from (--init-from), whose weights (and moments) it loads."""
        init_from = self.ctx.opts.init_from
        source = self._init_from(init_from) if init_from is not None else None
        self.ctx.counters.lineage = Lineage(
            world_sizes=[WorldSpan(from_step=0, world_size=self.ctx.world.size)],
            init_from=source.describe(self.ctx.opts.init_optimizer) if source is not None else None,
        )
        self.ctx.counters.source_manifest = source.content() if source is not None else None

    def _init_from(self, path: Path) -> Source | None:
        """Rank 0 reads and verifies the source and loads its weights (and with
        --init-from-optimizer Adam's state); the other ranks learn the outcome and the step count
        by broadcast (weights and moments follow when DDP wraps the model). The source on rank 0;
        SourceError (exit 2) on every rank when it cannot be used."""
        source: Source | None = None
        answer: dict = {}
        if self.ctx.main:
            try:
                source = read_source(path)
                self._load_source(source)
                answer = {"adam_step": source.manifest.optimizer.adam_step}
            except (SourceError, ValueError) as e:
                answer = {"refused": str(e)}
        if self.ctx.world.distributed:
            message = json.dumps(answer).encode() if self.ctx.main else None
            answer = json.loads(dist.broadcast_bytes(self.ctx.world, message))
        if "refused" in answer:
            raise SourceError(answer["refused"])
        if self.ctx.opts.init_optimizer:
            if not self.ctx.main:
                n = sum(p.numel() for p in self.ctx.parts.params)
                zeros = np.zeros(n, dtype=np.float32)
                payload = Payload(0, n, zeros, zeros, zeros)
                layout = self.ctx.parts.layout
                load_adam_state(
                    self.ctx.parts.optimizer,
                    self.ctx.parts.params,
                    layout,
                    payload,
                    answer["adam_step"],
                )
            self.moments_restored = True
        return source

    def _load_source(self, source: Source) -> None:
        """Rank 0: the source's verified weights into the model, and its moments when asked."""
        p = source.payload()
        m = source.manifest
        load_weights(list(self.ctx.parts.model.named_parameters()), m.layout, p.weights)
        if self.ctx.opts.init_optimizer:
            load_adam_state(
                self.ctx.parts.optimizer, self.ctx.parts.params, m.layout, p, m.optimizer.adam_step
            )
        log.info(
            "new run started from %s (step %d, sha256 %s…): its weights%s; this run's own config, "
            "data, schedule and random streams from step 0",
            source.path,
            m.step,
            m.bin_sha256[:12],
            f" and Adam's moments (step count {m.optimizer.adam_step})"
            if self.ctx.opts.init_optimizer
            else " (Adam starts afresh)",
        )

    def _same_world(self, m: Manifest) -> bool:
        return m.environment.world_size == self.ctx.world.size

    @staticmethod
    def _rank_state(m: Manifest, rank: int) -> RankState:
        """Rank `rank`'s RNG and cursor states as the checkpoint recorded them (a single
        process's are the manifest's own)."""
        if m.distributed is not None:
            return m.distributed.ranks[rank]
        return RankState(rank=0, rng=m.rng, data=m.data)

    def _continue_lineage(self, m: Manifest) -> None:
        """The run's lineage as this life continues it; at another world size, which generators
        carry over (each rank below the old size keeps its own), announced as not bit-exact."""
        lineage = m.lineage_or_default()
        self.ctx.counters.lineage = lineage.at_world(m.step, self.ctx.world.size)
        self.ctx.counters.source_manifest = m.source_manifest
        old = m.environment.world_size
        if self.ctx.world.rank < old:
            self._pending_rng = self._rank_state(m, self.ctx.world.rank).rng
        else:
            self._fresh_stream = True
        if old != self.ctx.world.size and self.ctx.main:
            log.warning(
                "resuming at world size %d from a checkpoint written by a job of %d: this resume "
                "will NOT be bit-exact with the run so far: each rank's dropout stream and the "
                "order of the gradient reduction change (%s); the data stream continues exactly, "
                "every rank drawing the same global order (%s); Adam's moments and the LR "
                "schedule continue",
                self.ctx.world.size,
                old,
                _streams_note(old, self.ctx.world.size),
                self.ctx.parts.batch.describe(),
            )

    def restore_rng(self) -> None:
        """Restore this rank's random generators from the checkpoint resumed (if any, and unless
        the negative control skips them): the last thing before the first step. A rank the
        checkpoint has no state for (a larger job than wrote it) starts a stream of its own,
        seeded by (seed, rank, step)."""
        if self._fresh_stream:
            seed_rank_stream(self.ctx.cfg.seed, self.ctx.world.rank, self.ctx.counters.step)
            return
        if self._pending_rng is None or "rng" in self.ctx.opts.skip_restore:
            return
        try:
            notes = rngstate.restore(self._pending_rng, self.ctx.platform.device)
        except (RuntimeError, ValueError) as e:
            # The same checkpoint fails the same way at every start: the operator must
            # decide, a restart cannot.
            raise ResumeRefused(
                "cannot restore the random generators of "
                f"step {self.ctx.counters.step}'s checkpoint: {e}"
            ) from e
        for note in notes:
            log.warning("this resume will NOT be bit-exact with the run so far: %s", note)

    def roll_back_to(self, boundary: int) -> Manifest:
        """Restore the checkpoint of step `boundary` whole, random generators and phase included
        (a single process following a pivot). Raises ResumeRefused when the checkpoint is gone or
        damaged: the trainer cannot follow the pivot, and says so (exit 4) rather than training
        on under the old phase."""
        if self.manager is None:
            raise RuntimeError("a roll-back is a single process's, which is rank 0")
        try:
            loaded = self.manager.load(self.expectation(), step=boundary)
        except ResumeRefused as e:
            raise ResumeRefused(
                f"cannot follow the proxy's pivot after step {boundary}: {e}"
            ) from None
        if loaded is None:  # a named step is loaded or refused, never absent: said all the same
            raise ResumeRefused(
                f"cannot follow the proxy's pivot: no checkpoint of step {boundary}"
            )
        self.restore(loaded.manifest, loaded.payload)
        self.ctx.counters.phase = loaded.manifest.mixing.phase
        rngstate.restore(loaded.manifest.rng, self.ctx.platform.device)
        return loaded.manifest

    def _find(self) -> tuple[Manifest | None, Payload | None]:
        """Rank 0 discovers and verifies; the other ranks receive its manifest (or its refusal)."""
        loaded: Loaded | None = None
        refusal: str | None = None
        if self.manager is not None:  # rank 0
            try:
                loaded = self.manager.load(self.expectation())
            except ResumeRefused as e:
                if not self.ctx.world.distributed:
                    raise
                refusal = str(e)
        if not self.ctx.world.distributed:
            return (loaded.manifest, loaded.payload) if loaded is not None else (None, None)
        message = None
        if self.ctx.main:
            message = json.dumps(
                {"refused": refusal}
                if refusal is not None
                else {"manifest": loaded.manifest.model_dump(mode="json") if loaded else None}
            ).encode()
        answer = json.loads(dist.broadcast_bytes(self.ctx.world, message))
        if answer.get("refused") is not None:
            raise ResumeRefused(answer["refused"])
        if self.ctx.main:
            for reason in loaded.skipped if loaded is not None else []:
                log.warning("skipped damaged checkpoint %s", reason)
            return (loaded.manifest, loaded.payload) if loaded is not None else (None, None)
        m = answer["manifest"]
        return (Manifest.model_validate(m), None) if m is not None else (None, None)

    def expectation(self) -> Expectation:
        """What a checkpoint must match for this run to resume from it exactly."""
        return Expectation(
            model=self.ctx.cfg.model,
            layout=self.ctx.parts.layout,
            data_identities={a.name: a.identity for a in self.ctx.parts.arms},
            config_hash=self.ctx.cfg.trajectory_hash(),
            allow_config_change=self.ctx.opts.allow_config_change,
            trajectory=self.ctx.cfg.trajectory(),
            tokenizer=self.ctx.parts.tokenizer.identity,
            tokenizer_description=self.ctx.parts.tokenizer.describe(full=True),
            check=self._manifest_problems,
        )

    def _manifest_problems(self, m: Manifest) -> list[str]:
        """What in `m` this run cannot take: cursors it cannot restore, and fields that contradict
        the step, the schedule or the recorded batches (a re-signed edit, see crosscheck.py)."""
        return self._cursor_problems(m) + self._crosscheck.problems(m)

    def _cursor_problems(self, m: Manifest) -> list[str]:
        """Cursors a resume could not take (an arm's chunk count differs from the data's). The
        cursor of an arm whose data changed is not taken at all (`_restore_cursors`: a change
        accepted with --allow-config-change starts it from the beginning), whatever its size; nor is
        one of another order (`[data] windows` changed, accepted alike)."""
        streams = {s.arm.name: s for s in self.ctx.parts.streams}
        return [
            f"arm {c.name!r}: cursor written for {c.n_chunks} chunks, the arm has "
            f"{streams[c.name].n_chunks}"
            for c in m.data
            if c.name in streams
            and _takes(streams[c.name], c)
            and c.n_chunks != streams[c.name].n_chunks
        ]

    def restore(self, m: Manifest, p: Payload | None) -> None:
        """Restore from manifest `m` and payload `p`, all but the random generators; without a
        payload (ranks other than 0 of a job), Adam's state is created with the right step count
        and filled by a broadcast."""
        if self.ctx.main:
            self._warn_if_inexact(m)
            self._warn_if_mixing_inputs_changed(m)
        if p is None:
            # The moments' shapes and step count only; a broadcast from rank 0 fills them.
            n = m.n_params
            zeros = np.zeros(n, dtype=np.float32)
            p = Payload(m.step, n, zeros, zeros, zeros)
        else:
            load_weights(list(self.ctx.parts.model.named_parameters()), m.layout, p.weights)
        load_adam_state(
            self.ctx.parts.optimizer, self.ctx.parts.params, m.layout, p, m.optimizer.adam_step
        )
        if "cursor" not in self.ctx.opts.skip_restore:
            self._restore_cursors(m)
        c = self.ctx.counters
        c.step = c.last_saved = m.step
        if self.ctx.main:  # the other ranks of a job may not see the run directory
            c.last_saved_at = (self.ctx.opts.run_dir / m.bin_file).stat().st_mtime
        c.tokens_seen = m.progress.tokens_seen
        c.train_seconds = m.progress.train_seconds
        if self.ctx.main:
            log.info(
                "resumed from %s (trigger %s, written %s)", m.bin_file, m.trigger, m.created_utc
            )

    def _restore_cursors(self, m: Manifest) -> None:
        # Every rank draws the whole global batch, so every rank's cursors are rank 0's (the
        # manifest's own): at another world size those are the data stream's position.
        mine = self._rank_state(m, self.ctx.world.rank).data if self._same_world(m) else m.data
        cursors = {c.name: c for c in mine}
        for s in self.ctx.parts.streams:
            saved = cursors.get(s.arm.name)
            if saved is not None and _takes(s, saved):
                s.load_state_dict(saved)
            else:
                # Only reachable with --allow-config-change (the resume check refuses it
                # otherwise): an added arm, one whose data changed, or one now cut into other
                # windows ([data] windows), starts at its beginning.
                log.warning(
                    "arm %r %s: its cursor starts at the beginning",
                    s.arm.name,
                    "is new"
                    if saved is None
                    else "has changed data"
                    if saved.identity != s.arm.identity
                    else "is cut into other windows ([data] windows)",
                )

    def _warn_if_inexact(self, m: Manifest) -> None:
        parts = self.ctx.parts
        now = environment_of(
            self.ctx.platform, self.ctx.world, parts.compiled, parts.parallel.sharding
        )
        changed = inexact_changes(m.environment, now)
        if (recompute := _recompute_change(m.config, self.ctx.cfg)) is not None:
            if self.ctx.parts.compiled:
                # Eager, the recompute runs the same kernels in the same order (measured bit for
                # bit on CPU); compiled, it is another graph, whose fusions may round otherwise.
                changed.append(f"{recompute} under torch.compile, whose graph it changes")
            else:
                log.info("%s: the same arithmetic, bit for bit (eager mode)", recompute)
        if changed:
            log.warning(
                "this resume will NOT be bit-exact with the run so far (%s)", "; ".join(changed)
            )

    def _warn_if_mixing_inputs_changed(self, m: Manifest) -> None:
        changed = evaluation_changes(m.config, self.ctx.cfg)
        if changed:
            log.warning(
                "the held-out evaluations changed (%s): under proxy mixing the bandit's reward "
                "(gated-plateau, the default of new runs, gated-fall and gated-heldout) reads them, "
                "so the arms of the steps from here on may differ from those the run so far would "
                "have had",
                "; ".join(changed),
            )


def _recompute_change(then: dict[str, Any], cfg: RunConfig) -> str | None:
    """`activation recompute none → blocks` when the checkpoint's segment trained otherwise."""
    model = then.get("model")
    was = model.get("recompute", "none") if isinstance(model, dict) else "none"
    now = cfg.model.recompute
    return None if was == now else f"activation recompute {was} → {now}"


def _streams_note(old: int, new: int) -> str:
    """Which ranks keep their random generators across a change of world size."""
    kept = (
        "rank 0 keeps its generators"
        if min(old, new) == 1
        else (f"ranks 0-{min(old, new) - 1} keep their generators")
    )
    if new > old:
        if new - old == 1:
            return f"{kept}; rank {old} starts a stream of its own"
        return f"{kept}; ranks {old}-{new - 1} start streams of their own"
    gone = f"rank {new}" if old - new == 1 else f"ranks {new}-{old - 1}"
    return f"{kept}; the generators of {gone} are dropped"


def _takes(stream: ArmStream, cursor: CursorState) -> bool:
    """Whether `stream` continues from `cursor`: the same data, in the same order."""
    return cursor.identity == stream.arm.identity and cursor.order == stream.order_rule
