"""The figures of `andreactl plan`: per-GPU memory, the batch per GPU, step time, disk under the
retention policy and the hours to rent, from a run's config and a GPU. Pure arithmetic on the
config (control/sizing.py) and the stated assumptions; torch-free.

What is exact and what is assumed: parameter, optimizer and checkpoint bytes are exact (tested
against a real run); activations are an estimate (within a few percent of torch's measured peak
on CPU, tests/unit/test_plan.py); speed follows from an MFU that is assumed unless measured in a run;
disk and rental hours follow from the stated bandwidths and start-up time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from andrea.control import reports, sizing
from andrea.daemon.config import ModelConfig, RunConfig
from andrea.daemon.data.batch_split import BatchShape

#: How the job holds the model: DDP replicates the whole state on each GPU; FSDP (FSDP2's
#: fully_shard per block, then the root) shards the fp32 weights, gradients and Adam's moments.
Strategy = Literal["ddp", "fsdp"]
STRATEGIES: tuple[Strategy, ...] = ("ddp", "fsdp")

GB = 10**9
GiB = 2**30
#: A loss record in .loss.json (measured: 225 bytes with its batch digest).
LOSS_ENTRY_BYTES = 230
#: An evaluation record per arm in .eval.json (measured: about 100 bytes).
EVAL_ARM_BYTES = 100
#: A manifest: its layout and config, one rank's random states (measured: 34 kB at andrea-tiny
#: for one process, 99 kB for two), more per parameter tensor and per rank.
MANIFEST_BASE_BYTES, MANIFEST_TENSOR_BYTES, MANIFEST_RANK_BYTES = 30_000, 120, 33_000
#: CUDA context, cuBLAS workspace and the allocator's slack, per GPU.
RUNTIME_RESERVE = 1 * GiB
RENTAL_WINDOWS_DAYS = (3, 7, 30)
#: The host's work per step that no GPU removes (eager dispatch of the forward and backward
#: passes, clipping and AdamW): base + per layer, CPU time of the calling thread measured with the
#: tensors shrunk to nothing by `tests/bench/bench_step_floor.py` (1.8-2.1 ms + 1.96-1.99 ms a
#: layer on the development machine's CPU; docs/andreactl.md). A faster host lowers it.
STEP_FLOOR_BASE_S, STEP_FLOOR_PER_LAYER_S = 0.002, 0.002
#: Passes over the run's training tokens past which the plan warns (repeated data stops helping
#: after about four epochs: Muennighoff et al. 2023, "Scaling Data-Constrained Language Models").
MAX_PASSES = 4.0


@dataclass(frozen=True)
class GpuSpec:
    """A GPU as the plan needs it: memory and dense peak TFLOPS per precision."""

    name: str
    memory_bytes: int
    bf16_tflops: float
    tf32_tflops: float
    fp32_tflops: float
    #: NCCL all-reduce bus bandwidth between the GPUs of one machine, GB/s.
    allreduce_gbps: float

    def peak(self, precision: str) -> float:
        return {"bf16": self.bf16_tflops, "tf32": self.tf32_tflops}.get(precision, self.fp32_tflops)


#: Data-sheet figures (dense, no sparsity; SXM boards where there are several). The all-reduce
#: bandwidths are typical NCCL bus bandwidths of an 8-GPU machine: NVLink 4 (H100, H200),
#: NVLink 3 (A100), PCIe 4 (L40S, which has no NVLink).
GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("h100", 80 * GB, 989.4, 494.7, 66.9, 350.0),
    "h200": GpuSpec("h200", 141 * GB, 989.4, 494.7, 66.9, 350.0),
    "a100-80gb": GpuSpec("a100-80gb", 80 * GB, 312.0, 156.0, 19.5, 230.0),
    "l40s": GpuSpec("l40s", 48 * GB, 362.05, 183.0, 91.6, 20.0),
}


def gpu_of(device_name: str | None) -> GpuSpec | None:
    """The table's row for a GPU as torch names it ('NVIDIA H100 80GB HBM3'), if any."""
    name = (device_name or "").upper()
    for key, marker in (("h200", "H200"), ("h100", "H100"), ("l40s", "L40S")):
        if marker in name:
            return GPUS[key]
    return GPUS["a100-80gb"] if "A100" in name and "80GB" in name else None


@dataclass(frozen=True)
class PlanInputs:
    """Everything the plan assumes besides the run's config."""

    source: str
    gpu: GpuSpec
    gpus: int
    precision: str
    steps: int
    mfu: float
    mfu_source: str
    disk_gbps: float
    staging_gbps: float
    startup_seconds: float
    #: The run's training tokens and how they were found (None: unknown).
    data_tokens: tuple[int, str] | None = None
    strategy: Strategy = "ddp"
    #: Activation recompute per block (`[model] recompute = "blocks"`).
    recompute: bool = False


#: The most steps a window is planned for (plan's --steps bound).
MAX_WINDOW_STEPS = 10**12


def step_floor_seconds(n_layer: int) -> float:
    """The least time a step of an `n_layer` model takes on the host, whatever the GPU."""
    return STEP_FLOOR_BASE_S + STEP_FLOOR_PER_LAYER_S * n_layer


@dataclass(frozen=True)
class _Costs:
    params: sizing.ParameterCount
    numerics: sizing.Numerics
    flops_per_token: int
    recompute_flops_per_token: int


def _costs(m: ModelConfig, precision: str) -> _Costs:
    return _Costs(
        sizing.parameters(m),
        sizing.cuda_numerics(precision),
        sizing.flops_per_token(m),
        sizing.recompute_flops_per_token(m),
    )


@dataclass(frozen=True)
class GpuState:
    """One GPU's bytes before activations, under a strategy."""

    weights: int
    gradients: int
    adam_moments: int
    bf16_weight_copies: int
    gathered: int

    @property
    def total(self) -> int:
        """With the runtime reserve: what the activations are added to."""
        parts = (self.weights, self.gradients, self.adam_moments, self.bf16_weight_copies)
        return sum(parts) + self.gathered + RUNTIME_RESERVE


def gpu_state(m: ModelConfig, strategy: Strategy, gpus: int, precision: str) -> GpuState:
    """The state one GPU holds. DDP: the whole fp32 weights, gradients and Adam's moments, and
    under bf16 autocast's bf16 copies of the matrices. FSDP (fully_shard per block, then the root;
    fp32 master weights, gradients reduce-scattered; bf16 compute under bf16): rank 0's shard of
    each (the largest), plus the gathered units in the compute dtype: the root (embeddings, final
    norm, head), never resharded during a step, with its gradients; the block computing and the
    next, prefetched; one block's gradients and their fp32 copy for the reduce-scatter."""
    p = sizing.parameters(m)
    step_counts = sizing.FP32 * p.n_tensors
    if strategy == "ddp":
        copies = 2 * (p.n_params - p.embedding_params) if precision == "bf16" else 0
        return GpuState(p.weight_bytes, p.gradient_bytes, p.optimizer_bytes, copies, gathered=0)
    shard = sizing.sharded_elements(m, gpus)
    compute = 2 if precision == "bf16" else sizing.FP32
    block = p.block_params
    root = p.n_params - m.n_layer * block
    gathered = compute * (2 * root + 2 * block) + (compute + sizing.FP32) * block
    return GpuState(
        sizing.FP32 * shard,
        sizing.FP32 * shard,
        2 * sizing.FP32 * shard + step_counts,
        0,
        gathered,
    )


def make_plan(cfg: RunConfig, shape: BatchShape, inputs: PlanInputs) -> reports.PlanReport:
    """The plan of `cfg` trained as `shape` (daemon/data/batch_split.py) under `inputs`."""
    costs = _costs(cfg.model, inputs.precision)
    memory = _memory(cfg, shape, inputs, costs)
    speed = _speed(shape, inputs, costs, cfg.model.n_layer)
    data = _data(shape, inputs)
    checkpoints = _checkpoints(cfg, inputs, costs)
    return reports.PlanReport(
        source=inputs.source,
        preset=cfg.preset,
        model=cfg.model.model_dump(mode="json"),
        n_params=costs.params.n_params,
        parameter_bytes=costs.params.weight_bytes,
        optimizer_bytes=costs.params.optimizer_bytes,
        precision=inputs.precision,
        gpu=reports.PlanGpu(
            name=inputs.gpu.name,
            memory_bytes=inputs.gpu.memory_bytes,
            peak_tflops=inputs.gpu.peak(inputs.precision),
            count=inputs.gpus,
        ),
        batch=_batch(shape),
        memory=memory,
        speed=speed,
        checkpoints=checkpoints,
        rental=_rental(cfg, inputs, costs, speed, checkpoints),
        data=data,
        options=(options := _options(cfg, shape, inputs, costs)),
        recommended=recommend(options, shape.per_rank),
        assumptions=_assumptions(inputs, costs),
        warnings=_warnings(shape, memory, data),
    )


def steps_in_window(cfg: RunConfig, shape: BatchShape, inputs: PlanInputs, days: float) -> int:
    """The most steps whose rental hours (training, checkpoint stalls, evaluation, one stop and
    resume, the export: `_rental`) fit in `days` days; 0 when not even the fixed hours do. The
    hours grow with the steps (never shrink), so a bisection finds it."""
    costs = _costs(cfg.model, inputs.precision)

    def fits(steps: int) -> bool:
        at = replace(inputs, steps=steps)
        speed = _speed(shape, at, costs, cfg.model.n_layer)
        hours = _rental(cfg, at, costs, speed, _checkpoints(cfg, at, costs)).total_hours
        return hours <= days * 24

    if not fits(0):
        return 0
    low, high = 0, 1
    while fits(high) and high < MAX_WINDOW_STEPS:
        low, high = high, min(2 * high, MAX_WINDOW_STEPS)
    if fits(high):
        return high
    while high - low > 1:  # fits(low), not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _data(shape: BatchShape, inputs: PlanInputs) -> reports.PlanData | None:
    if inputs.data_tokens is None:
        return None
    tokens, how = inputs.data_tokens
    planned = shape.tokens_per_step * inputs.steps
    return reports.PlanData(
        training_tokens=tokens,
        how=how,
        planned_tokens=planned,
        passes=planned / tokens if tokens else None,
    )


def _batch(shape: BatchShape) -> reports.PlanBatch:
    t = shape.tokens_per_sequence
    return reports.PlanBatch(
        sequences_per_step=shape.per_step,
        grad_accum=shape.grad_accum,
        sequences_per_micro_batch=shape.micro_batch,
        sequences_per_gpu_micro_batch=shape.per_rank,
        tokens_per_step=shape.tokens_per_step,
        tokens_per_gpu_per_step=shape.tokens_per_step // shape.world,
        tokens_per_gpu_micro_batch=shape.per_rank * t,
    )


def _memory(
    cfg: RunConfig, shape: BatchShape, inputs: PlanInputs, costs: _Costs
) -> reports.PlanMemory:
    p, n, rc = costs.params, costs.numerics, inputs.recompute
    per_sequence = sizing.activation_bytes(cfg.model, 1, n, rc)
    activations = sizing.activation_bytes(cfg.model, shape.per_rank, n, rc)
    state = gpu_state(cfg.model, inputs.strategy, inputs.gpus, inputs.precision)
    total = state.total + activations
    room = inputs.gpu.memory_bytes - state.total
    return reports.PlanMemory(
        strategy=inputs.strategy,
        recompute=rc,
        weights=state.weights,
        gradients=state.gradients,
        adam_moments=state.adam_moments,
        bf16_weight_copies=state.bf16_weight_copies,
        gathered=state.gathered,
        activations=activations,
        activations_per_sequence=per_sequence,
        checkpoint_staging=0,
        runtime_reserve=RUNTIME_RESERVE,
        total=total,
        gpu_memory=inputs.gpu.memory_bytes,
        headroom=inputs.gpu.memory_bytes - total,
        fits=total <= inputs.gpu.memory_bytes,
        largest_micro_batch=largest_fitting(cfg.model, n, room, rc),
        host_staging=p.checkpoint_bytes,
        attention=n.attention,
    )


def largest_fitting(m: ModelConfig, n: sizing.Numerics, room: int, recompute: bool) -> int:
    """The most sequences whose activations fit in `room` bytes (activations are linear in the
    sequences but for a constant: the estimate of one, scaled, then checked)."""
    per_sequence = sizing.activation_bytes(m, 1, n, recompute)
    if room < per_sequence:
        return 0
    b = room // per_sequence
    while b > 0 and sizing.activation_bytes(m, b, n, recompute) > room:
        b -= 1
    return b


def _options(
    cfg: RunConfig, shape: BatchShape, inputs: PlanInputs, costs: _Costs
) -> list[reports.PlanOption]:
    """DDP and FSDP, each without and with recompute, on the plan's GPUs and micro-batch."""
    out = []
    for recompute in (False, True):
        for strategy in STRATEGIES:
            at = replace(inputs, strategy=strategy, recompute=recompute)
            memory = _memory(cfg, shape, at, costs)
            out.append(
                reports.PlanOption(
                    strategy=strategy,
                    recompute=recompute,
                    state_bytes=memory.total - memory.activations,
                    activations_per_sequence=memory.activations_per_sequence,
                    largest_micro_batch=memory.largest_micro_batch,
                    fits=memory.fits,
                    step_seconds=_speed(shape, at, costs, cfg.model.n_layer).step_seconds,
                )
            )
    return out


def recommend(
    options: list[reports.PlanOption], micro_batch: int
) -> reports.PlanRecommendation | None:
    """The first option (DDP, FSDP, DDP with recompute, FSDP with recompute: the least
    communication, then the least arithmetic) that holds the plan's micro-batch; else the one
    that holds the most sequences, with fewer a micro-batch; None when none holds one."""
    for o in options:
        if o.fits:
            return reports.PlanRecommendation(
                strategy=o.strategy,
                recompute=o.recompute,
                why=f"the first that holds the planned {micro_batch} sequence(s) per GPU "
                "micro-batch, in the order ddp, fsdp, ddp + recompute, fsdp + recompute",
            )
    best = max(options, key=lambda o: o.largest_micro_batch)
    if best.largest_micro_batch == 0:
        return None
    return reports.PlanRecommendation(
        strategy=best.strategy,
        recompute=best.recompute,
        why=f"none holds the planned {micro_batch} sequence(s) per GPU micro-batch; this holds "
        f"the most, {best.largest_micro_batch}: raise grad_accum",
    )


def _speed(shape: BatchShape, inputs: PlanInputs, costs: _Costs, n_layer: int) -> reports.PlanSpeed:
    peak = inputs.gpus * inputs.gpu.peak(inputs.precision) * 1e12
    # The MFU counts the model's FLOPs; recompute's are done at the same rate, on top.
    flops = costs.flops_per_token + (costs.recompute_flops_per_token if inputs.recompute else 0)
    compute = shape.tokens_per_step * flops / (inputs.mfu * peak)
    # A ring all-reduce moves 2 (k - 1) / k of the fp32 gradients through each GPU, once a step;
    # FSDP moves (k - 1) / k of the weights in the compute dtype twice (the forward's all-gather
    # and the backward's, after the forward resharded them) and of the fp32 gradients once (the
    # reduce-scatter). Both overlap with compute; counted in full, the step time is an upper bound.
    k, n = inputs.gpus, costs.params.n_params
    if inputs.strategy == "ddp":
        moved = 2 * costs.params.gradient_bytes
    else:
        moved = 2 * (2 if inputs.precision == "bf16" else sizing.FP32) * n + sizing.FP32 * n
    allreduce = (k - 1) / k * moved / (inputs.gpu.allreduce_gbps * GB)
    floor = step_floor_seconds(n_layer)
    step = max(compute + allreduce, floor)
    return reports.PlanSpeed(
        mfu=inputs.mfu,
        mfu_source=inputs.mfu_source,
        flops_per_token=costs.flops_per_token,
        compute_seconds=compute,
        allreduce_seconds=allreduce,
        floor_seconds=floor,
        step_seconds=step,
        tokens_per_second=shape.tokens_per_step / step,
        steps=inputs.steps,
        training_seconds=step * inputs.steps,
    )


def _checkpoints(cfg: RunConfig, inputs: PlanInputs, costs: _Costs) -> reports.PlanCheckpoints:
    ck, p = cfg.checkpoint, costs.params
    payload = p.checkpoint_bytes
    manifest = MANIFEST_BASE_BYTES + MANIFEST_TENSOR_BYTES * p.n_tensors
    manifest += MANIFEST_RANK_BYTES * inputs.gpus if inputs.gpus > 1 else 0
    write = payload / (inputs.disk_gbps * GB)
    # A cadence checkpoint written in the background stalls training for its staging copy only.
    stall = payload / (inputs.staging_gbps * GB) if ck.async_write else write
    cadences = inputs.steps // ck.every if ck.every else 0
    audit = ck.max_requested if ck.keep_requested else 0
    kept = ck.keep_latest + 1
    checkpoint_disk = (kept + audit) * (payload + manifest)
    loss_log = LOSS_ENTRY_BYTES * inputs.steps
    return reports.PlanCheckpoints(
        payload_bytes=payload,
        manifest_bytes=manifest,
        every=ck.every,
        disk_gbps=inputs.disk_gbps,
        write_seconds=write,
        stall_seconds=stall,
        stalls_seconds=stall * cadences,
        kept_cadence=kept,
        kept_audit=audit,
        checkpoint_disk_bytes=checkpoint_disk,
        loss_log_bytes=loss_log,
        export_bytes=payload + manifest,
        disk_bytes=checkpoint_disk + loss_log + payload + manifest,
    )


def _rental(
    cfg: RunConfig,
    inputs: PlanInputs,
    costs: _Costs,
    speed: reports.PlanSpeed,
    ck: reports.PlanCheckpoints,
) -> reports.PlanRental:
    every = cfg.eval.every if cfg.eval.every is not None else cfg.checkpoint.every
    evals = inputs.steps // every if every else 0
    eval_tokens = cfg.eval.sequences * len(cfg.data.arms) * cfg.model.block_size
    # Forward only (a third of a training token's FLOPs), on rank 0's GPU.
    one_gpu = inputs.mfu * inputs.gpu.peak(inputs.precision) * 1e12
    evaluation = evals * eval_tokens * costs.flops_per_token / 3 / one_gpu
    read = ck.payload_bytes / (inputs.disk_gbps * GB)
    stop_resume = ck.write_seconds + inputs.startup_seconds + read
    # The export hashes the source, writes the copy and reads it back to verify it.
    export = inputs.startup_seconds + 3 * read
    hours = [s / 3600 for s in (speed.training_seconds, ck.stalls_seconds, evaluation)]
    hours += [stop_resume / 3600, export / 3600]
    total = sum(hours)
    return reports.PlanRental(
        training_hours=hours[0],
        checkpoint_stall_hours=hours[1],
        evaluation_hours=hours[2],
        stop_resume_hours=hours[3],
        export_hours=hours[4],
        total_hours=total,
        fits_days={d: total <= 24 * d for d in RENTAL_WINDOWS_DAYS},
    )


def _assumptions(inputs: PlanInputs, costs: _Costs) -> dict[str, str]:
    attention = "fused attention (flash or memory-efficient, deterministic in that mode)"
    return {
        "gpu": f"{inputs.gpu.name}: {inputs.gpu.memory_bytes / GB:.0f} GB, "
        f"{inputs.gpu.peak(inputs.precision):g} dense TFLOPS at {inputs.precision}",
        "mfu": f"{inputs.mfu:.0%} ({inputs.mfu_source})",
        "allreduce": f"{inputs.gpu.allreduce_gbps:g} GB/s all-reduce bus bandwidth (FSDP's "
        "all-gathers and reduce-scatters at the same), not overlapped with compute",
        "fsdp": "FSDP2: fully_shard per block, then the root; fp32 master weights, gradients and "
        "Adam sharded on the first dimension (rank 0's shard, the largest); weights gathered in "
        "the compute dtype, resharded after the forward; the root and two blocks gathered at once",
        "activations": f"eager mode, {attention}; estimated (control/sizing.py)",
        "runtime_reserve": f"{RUNTIME_RESERVE / GiB:.0f} GiB per GPU for the CUDA context, "
        "cuBLAS workspace and allocator slack",
        "disk": f"{inputs.disk_gbps:g} GB/s sustained write and read",
        "staging": f"{inputs.staging_gbps:g} GB/s device-to-host copy of a background checkpoint",
        "startup": f"{inputs.startup_seconds:g} s per start (interpreter, data from its cache, "
        "resume, compile)",
        "step_floor": f"{STEP_FLOOR_BASE_S * 1000:g} ms + {STEP_FLOOR_PER_LAYER_S * 1000:g} ms a "
        "layer per step at least: the host's dispatch of the step, measured "
        "(tests/bench/bench_step_floor.py)",
        "data": inputs.data_tokens[1] if inputs.data_tokens else "the run's data is not known",
        "disk_used": "checkpoint.keep_latest cadence checkpoints and one being written, "
        "checkpoint.max_requested audit points (SIGUSR1, control, pivot boundaries) all used, "
        f"{LOSS_ENTRY_BYTES} bytes of .loss.json per step, one export; tokenized data not counted",
    }


def _warnings(
    shape: BatchShape, memory: reports.PlanMemory, data: reports.PlanData | None
) -> list[str]:
    out = []
    if data is not None and (data.passes is None or data.passes > MAX_PASSES):
        passes = "endless" if data.passes is None else f"{data.passes:,.1f}"
        out.append(
            f"{passes} passes over the run's {data.training_tokens:,} training tokens "
            f"({data.planned_tokens:,} planned): past about {MAX_PASSES:g}, repeated data stops "
            "helping and the model memorises it; add data or plan fewer steps"
        )
    if shape.per_rank == 1:
        out.append(
            f"each GPU trains a single sequence per micro-batch ({shape.per_step} per step over "
            f"{shape.world} GPUs in {shape.grad_accum} micro-batch(es)): the GPU is mostly idle "
            "and the step's arithmetic is latency-bound; raise batch_size (docs/distributed.md, "
            "choosing the batch)"
        )
    if not memory.fits:
        accum = _accumulation_to_fit(shape, memory.largest_micro_batch)
        out.append(
            f"does not fit: {memory.total / GiB:.1f} GiB per GPU needed, "
            f"{memory.gpu_memory / GiB:.1f} GiB there; at most {memory.largest_micro_batch} "
            "sequences per GPU micro-batch fit" + (f": grad_accum {accum} would" if accum else "")
        )
    return out


def _accumulation_to_fit(shape: BatchShape, largest: int) -> int | None:
    """The smallest grad_accum that cuts the step into micro-batches that fit, if any does."""
    for accum in range(shape.grad_accum, shape.per_step + 1):
        micro, rest = divmod(shape.per_step, accum)
        if not rest and micro % shape.world == 0 and 0 < micro // shape.world <= largest:
            return accum
    return None
