"""Rank 0's audits of the current weights: held-out losses and text samples.

Neither draws from a generator that training uses, so a run with them is bit-identical to the
same run without them (see daemon/trainer/heldout_loss.py). Neither ever ends a run: an evaluation or a sample
that fails is logged, recorded as not done, and training goes on. Samples are encoded and decoded
with the run's tokenizer (daemon/data/tokenizer.py), whose decoding never fails. A stop request cuts
either short, and what it cut is never recorded: no partial evaluation, no truncated sample.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import DEFAULT_PROMPT_TOKENS, SamplesConfig
from andrea.daemon.data.arms import Arm
from andrea.daemon.data.tokenizer import RunTokenizer
from andrea.daemon.rundir.evallog import ArmEval, EvalEntry
from andrea.daemon.trainer.context import TrainerContext
from andrea.daemon.trainer.heldout_loss import Evaluator, Prober
from andrea.daemon.trainer.sink import RecordSink
from andrea.protocol import messages
from andrea.protocol.limits import MAX_SAMPLE_PROMPT, MAX_SAMPLES
from andrea.protocol.status import Activity
from andrea.protocol.transport import new_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """What a sample continues: its ids, and its text as the sample records it."""

    text: str
    ids: list[int]


def sample_prompts(cfg: SamplesConfig, arms: list[Arm], tokenizer: RunTokenizer) -> list[Prompt]:
    """The prompts of `[samples]`, encoded with the run's tokenizer, or by default the first
    `DEFAULT_PROMPT_TOKENS` ids of each arm's first held-out document (of its training tokens when
    it holds none out): ids the tokenizer itself produced, so a prompt never ends where it would
    not cut the text (a lone trailing space, whose continuation then starts with another). A
    prompt that encodes to nothing is left out, saying so."""
    if cfg.prompts is not None:
        out = []
        for text in cfg.prompts:
            if ids := tokenizer.encode(text):
                out.append(Prompt(text, ids))
            else:
                log.warning("sample prompt %r encodes to no token; it is left out", text)
        return out
    defaults: list[Prompt] = []
    for arm in arms:
        tokens = arm.tokens
        if arm.heldout is not None and arm.heldout.shape[0] > 0:
            tokens = arm.heldout
        n = min(DEFAULT_PROMPT_TOKENS, int(tokens.shape[0]))
        ids = [int(t) for t in np.asarray(tokens[np.arange(n)])]
        if ids and all(p.ids != ids for p in defaults) and len(defaults) < MAX_SAMPLES:
            defaults.append(Prompt(tokenizer.decode(ids)[:MAX_SAMPLE_PROMPT], ids))
    return defaults


@dataclass(frozen=True)
class EvalPlan:
    """The run's held-out evaluation as this life starts."""

    evaluator: Evaluator
    #: Evaluate every this many steps; 0: never.
    every: int
    #: A stop interrupted the evaluation of the checkpointed step: it is done first.
    catch_up: bool


def plan_evaluation(ctx: TrainerContext, manifest: Manifest | None) -> EvalPlan:
    """Build the fixed evaluation set and decide the cadence (every rank)."""
    cfg, parts, counters = ctx.cfg, ctx.parts, ctx.counters
    every = cfg.eval_every()
    evaluator = Evaluator(
        parts.arms, cfg.model.block_size, cfg.eval.sequences, parts.micro_batch, ctx.platform.device
    )
    if not cfg.data.heldout_fraction:
        log.info(
            "no held-out evaluation: this run holds nothing out (see its held-out split above)"
        )
        every = 0
    elif not evaluator:
        log.warning("no arm has held-out data for even one sequence: no held-out evaluation")
        every = 0
    catch_up = False
    if manifest is not None:
        counters.last_eval_step = manifest.last_eval_step
        if manifest.heldout is not None and manifest.last_eval_step == counters.step:
            counters.heldout = dict(manifest.heldout)
        catch_up = bool(
            every and counters.step % every == 0 and counters.last_eval_step < counters.step
        )
    return EvalPlan(evaluator, every, catch_up)


class Evaluation:
    """Held-out evaluation and samples at their cadences.

    Whether a step is due either is a pure function of the step and the config, the same on every
    rank of a job, and every rank takes the same path through that step's boundary (loop.py agrees
    again after samples and after a catch-up, on every rank). Rank 0 alone does the work, with the
    plain model: no collective, so the other ranks simply wait for it at the next collective. Under
    a strategy whose forward passes are collectives (FSDP: `joint_forward`), every rank runs them
    with rank 0, on the same inputs with the same generator, and rank 0 alone records; a stop then
    waits for them rather than cutting them short on the ranks it reached first."""

    def __init__(self, ctx: TrainerContext, plan: EvalPlan, sink: RecordSink) -> None:
        self.ctx = ctx
        self.main = ctx.main
        #: Every rank runs the forward passes with rank 0 (its weights are gathered by collectives).
        self.joint = ctx.parts.parallel.joint_forward
        self.evaluator = plan.evaluator
        self.every = plan.every
        self.sink = sink
        self.last_eval: EvalEntry | None = None
        self.eval_seconds = 0.0
        #: The same on every rank: the plan is built from the manifest that every rank reads.
        self._catch_up = plan.catch_up
        self._prompts: list[Prompt] | None = None
        #: The probe set of each set of target arms asked for, built at its first probe.
        self._probes: dict[tuple[str, ...], Prober] = {}
        self.probe_seconds = 0.0
        self.probes = 0

    def due(self, step: int) -> bool:
        """Whether `step` is evaluated (every rank alike; rank 0 evaluates: `at_step`)."""
        return bool(self.every) and step % self.every == 0

    def samples_due(self, step: int) -> bool:
        """Whether `step` is sampled (every rank alike; rank 0 samples: `samples`)."""
        every = self.ctx.cfg.samples.every
        return bool(every) and step % every == 0

    def at_step(self) -> None:
        """Rank 0: evaluate the step just trained (the other ranks: nothing, or under a joint
        forward the same forward passes)."""
        if self.main or self.joint:
            self.evaluate()

    def catch_up(self) -> bool:
        """The evaluation of the checkpointed step that a stop interrupted in the last life, once,
        before the first step of this one (after its first assignment: with the proxy, that is
        when the segment is known). True on every rank when it was due, whether rank 0 finished
        it or a stop cut it short again: the loop then agrees once more before a step, and a stop
        heard meanwhile reaches every rank there rather than rank 0 alone."""
        if not self._catch_up:
            return False
        self._catch_up = False
        self.at_step()
        return True

    def evaluate(self) -> EvalEntry | None:
        """Score the current weights on every arm's held-out sequences and record the result
        (the proxy's .eval.json, or the trainer's own in fixed mode). None, recording nothing,
        when a stop request interrupted it."""
        c = self.ctx.counters
        c.activity = Activity.EVALUATING
        log.info("evaluating step %d on held-out data", c.step)
        try:
            result = self.evaluator.evaluate(
                self.ctx.parts.model, self.ctx.platform.numerics, self._should_stop
            )
        except Exception as e:  # an audit never ends a run (out of memory on a large set, say)
            log.error("evaluation of step %d failed (%r); training goes on without it", c.step, e)
            return None
        finally:
            self.ctx.notifier.tick()
        if not self.main:
            return None  # a joint forward's: rank 0 records
        if result is None:
            log.info(
                "evaluation of step %d abandoned: stop requested (it runs again after the resume)",
                c.step,
            )
            return None
        self.eval_seconds += result.seconds
        entry = EvalEntry(
            step=c.step,
            segment=c.segment,
            phase=c.phase,
            arms={
                name: ArmEval(loss=r.loss, sequences=r.sequences, tokens=r.tokens)
                for name, r in result.losses.items()
            },
            seconds=result.seconds,
            wall_time=time.time(),
        )
        self.sink.record_eval(entry)
        self.last_eval, c.last_eval_step = entry, c.step
        c.heldout = {n: a.loss for n, a in entry.arms.items()}
        log.info(
            "held-out loss at step %d: mean %.4f | %s | %.2f s (%.1f%% of training time so far)",
            c.step,
            entry.mean_loss(),
            " | ".join(f"{n} {a.loss:.4f}" for n, a in entry.arms.items()),
            result.seconds,
            100 * self.eval_seconds / max(c.train_seconds, 1e-9),
        )
        return entry

    def _should_stop(self) -> bool:
        """Whether a stop cuts the work short: never under a joint forward, where a rank that
        stopped alone would leave the others waiting in the next forward's collective."""
        return not self.joint and self.ctx.flags.stop_requested()

    def probe(self, arms: list[str]) -> dict[str, float]:
        """Each target arm's loss on its probe (`heldout_loss.Prober`) with the current weights,
        for the record of the step just trained (the proxy's transfer reward reads it). Rank 0's;
        under a joint forward (FSDP) every rank runs it with rank 0, as the agreement told them."""
        key = tuple(sorted(arms))
        prober = self._probes.get(key)
        if prober is None:
            chosen = [a for a in self.ctx.parts.arms if a.name in key]
            prober = Prober(chosen, self.ctx.cfg.model.block_size, self.ctx.platform.device)
            self._probes[key] = prober
        losses, seconds = prober.probe(self.ctx.parts.model, self.ctx.platform.numerics)
        self.probe_seconds += seconds
        self.probes += 1
        return losses

    def prompts(self) -> list[Prompt]:
        """The prompts of this life's samples, decided (and logged) at the first sampling."""
        if self._prompts is None:
            cfg = self.ctx.cfg.samples
            self._prompts = sample_prompts(cfg, self.ctx.parts.arms, self.ctx.parts.tokenizer)
            log.info(
                "samples continue %s: %s",
                "the prompts of [samples]"
                if cfg.prompts is not None
                else f"the first {DEFAULT_PROMPT_TOKENS} tokens of each arm's held-out data",
                " | ".join(repr(p.text) for p in self._prompts) or "none",
            )
        return self._prompts

    def sample(self) -> list[messages.Sample] | None:
        """Generate from the prompts with a generator of its own, seeded by (seed, step), so that
        auditing never draws from the RNGs that training uses; decoded with the run's tokenizer.
        None when a stop request cut a sample short: a truncated sample is never returned."""
        ctx = self.ctx
        device, step, s = ctx.platform.device, ctx.counters.step, ctx.cfg.samples
        g = torch.Generator(device=device)
        g.manual_seed((ctx.cfg.seed * 1_000_003 + step) % 2**63)
        out = []
        for prompt in self.prompts():
            idx = torch.tensor([prompt.ids], dtype=torch.long, device=device)
            with ctx.platform.numerics.autocast(device):
                toks = ctx.parts.model.generate(
                    idx, s.max_new_tokens, g, s.temperature, self._should_stop, s.top_k
                )
            if toks.shape[1] - idx.shape[1] < s.max_new_tokens:
                return None
            # A sample's text must fit its record (protocol.messages.Sample).
            text = ctx.parts.tokenizer.decode(toks[0].tolist())[: messages.MAX_SAMPLE_TEXT]
            out.append(messages.Sample(prompt=prompt.text, text=text))
        return out

    def samples(self) -> None:
        """Rank 0 (the other ranks: nothing): log the samples of the current step and record
        them, unless a stop is requested. A sample that fails is logged, and training goes on: a
        sample never ends a run. Samples a stop cut short are neither logged nor recorded."""
        if not (self.main or self.joint) or self._should_stop():
            return
        c = self.ctx.counters
        log.info("generating samples at step %d", c.step)
        try:
            samples = self.sample()
        except Exception as e:
            log.error("the samples of step %d failed (%r); training goes on", c.step, e)
            return
        if not self.main:
            return  # a joint forward's: rank 0 records
        if samples is None:
            log.info("samples of step %d abandoned: stop requested (none is recorded)", c.step)
            return
        if not samples:
            return
        report = messages.SampleReport(
            id=new_id(), step=c.step, segment=c.segment, phase=c.phase, samples=samples
        )
        for sample in samples:
            log.info("sample at step %d: %r", c.step, sample.text)
        self.sink.record_samples(report)
