"""The model a rental window can afford: the compute-optimal size of each of the seed's windows
(Chinchilla, Hoffmann et al. 2022: about 20 training tokens a parameter, and C = 6 N D), and the
largest model each strategy holds on the plan's GPUs. Torch-free arithmetic over control/sizing.py
and control/planning.py.

A parameter count becomes a shape by one rule, the GPT-3 6.7B shape's proportions: heads of 128,
as many heads as layers (width = 128 x layers), the plan's context and vocabulary. It gives the
6.7B shape exactly at 32 layers; it is a rule for sizing, not a recommendation of the shape to
train.
"""

from __future__ import annotations

import math

from andrea.control import reports, sizing
from andrea.control.planning import (
    RENTAL_WINDOWS_DAYS,
    STRATEGIES,
    GpuSpec,
    Strategy,
    gpu_state,
    largest_fitting,
)
from andrea.daemon.config import ModelConfig

#: Chinchilla's compute-optimal training tokens per parameter.
TOKENS_PER_PARAM = 20.0
#: The MFU the windows are sized at unless --mfu says otherwise: a model of billions of
#: parameters on H100-class GPUs (the issue's figure); the plan's own default is a small model's.
DEFAULT_SCALING_MFU = 0.40
HEAD_DIM = 128
SHAPE_RULE = (
    f"width {HEAD_DIM} x layers, heads of {HEAD_DIM} (the GPT-3 6.7B shape's proportions), the "
    "plan's context and vocabulary"
)
#: The deepest shape tried for the largest model held (width 32,768: 400B parameters).
MAX_LAYERS = 256


def optimal_params(compute_flops: float) -> int:
    """N with C = 6 N D and D = TOKENS_PER_PARAM x N."""
    return int(math.sqrt(compute_flops / (6 * TOKENS_PER_PARAM)))


def shape_of(layers: int, like: ModelConfig) -> ModelConfig:
    """The rule's shape of `layers` layers, with `like`'s context and vocabulary."""
    return ModelConfig(
        vocab_size=like.vocab_size,
        block_size=like.block_size,
        n_layer=layers,
        n_head=layers,
        n_embd=HEAD_DIM * layers,
        dropout=0.0,
        recompute="blocks",
    )


def holds(m: ModelConfig, strategy: Strategy, gpu: GpuSpec, gpus: int, precision: str) -> bool:
    """Whether one GPU of `gpus` holds `m`'s state under `strategy` and the activations of one
    sequence with recompute."""
    room = gpu.memory_bytes - gpu_state(m, strategy, gpus, precision).total
    return largest_fitting(m, sizing.cuda_numerics(precision), room, True) >= 1


def largest_held(
    like: ModelConfig, strategy: Strategy, gpu: GpuSpec, gpus: int, precision: str
) -> int:
    """The parameters of the largest shape of the rule that `holds` (0: not even one layer)."""
    largest = 0
    for layers in range(1, MAX_LAYERS + 1):
        m = shape_of(layers, like)
        if not holds(m, strategy, gpu, gpus, precision):
            break
        largest = _params(m)
    return largest


def scaling(
    like: ModelConfig, gpu: GpuSpec, gpus: int, precision: str, mfu: tuple[float, str]
) -> reports.PlanScaling:
    """The compute-optimal model of each rental window on `gpus` x `gpu` at `mfu`, whether each
    strategy holds it, and the largest model each holds."""
    per_second = gpus * gpu.peak(precision) * 1e12 * mfu[0]
    largest = {s: largest_held(like, s, gpu, gpus, precision) for s in STRATEGIES}
    windows = []
    for days in RENTAL_WINDOWS_DAYS:
        compute = per_second * days * 86_400
        n = optimal_params(compute)
        windows.append(
            reports.PlanScaleWindow(
                days=days,
                compute_flops=compute,
                params=n,
                tokens=int(TOKENS_PER_PARAM * n),
                # Held where a shape of the rule at least as large is.
                holds={s: n <= largest[s] for s in STRATEGIES},
            )
        )
    return reports.PlanScaling(
        mfu=mfu[0],
        mfu_source=mfu[1],
        tokens_per_param=TOKENS_PER_PARAM,
        shape_rule=SHAPE_RULE,
        windows=windows,
        largest_params=largest,
    )


def _params(m: ModelConfig) -> int:
    return sizing.parameters(m).n_params
