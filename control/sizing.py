"""What a model costs, from its config alone: parameters, optimizer state, checkpoint bytes,
activation memory of a micro-batch, and the arithmetic of a training token. Torch-free, so that
`andreactl plan` and `size` answer at once; every exact figure here is tested against a real run
(tests/unit/test_plan.py) and the activation estimate against torch's measured peak on CPU.

Parameters follow daemon/model.py: token and position embeddings, per layer two norms, the fused
q/k/v projection, the attention's output projection and a 4x MLP, a final norm and a separate
(untied) output head.

Activations are what the backward pass keeps, per layer and per token, in the step as the trainer
runs it (eager mode; torch.compile fuses some of it away):
- the residual stream twice (the input of each norm), in fp32: the embeddings are fp32 and a
  residual add promotes autocast's bf16 outputs back to fp32;
- in the activation dtype (bf16 under autocast, else fp32): each linear layer's input (the norms'
  outputs cast for the projections, the attention's output, the MLP's 4x hidden before and after
  GELU), the q/k/v projection, and one more width for the attention (the scaled q that the math
  path multiplies, or the output the fused kernel keeps);
- attention: with the math path (CPU training with dropout) the
  softmax of the B x H x T x T scores, and with dropout its mask and the dropped copy; a fused
  kernel (flash or memory-efficient) keeps O(T) per head instead;
- with dropout, a mask per dropout site (the residual branches and the embeddings);
- at the head: the final norm's input, its output, the logits and cross-entropy's log-softmax,
  and during the first backward operations two more copies of the logits' size (their
  gradients), which is when the memory peaks.

With activation recompute (`[model] recompute = "blocks"`) a block keeps its input alone (the
fp32 residual stream); the peak is then the larger of the head's backward and one block computed
again (its activations above, its output, two gradients of the residual's width, the logits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from andrea.daemon.checkpoint.format import payload_size
from andrea.daemon.config import ModelConfig

FP32 = 4


@dataclass(frozen=True)
class ParameterCount:
    """The model's parameters: how many, in how many tensors, the embeddings among them, and one
    transformer block's (the unit FSDP gathers)."""

    n_params: int
    n_tensors: int
    embedding_params: int
    block_params: int = 0

    @property
    def weight_bytes(self) -> int:
        return FP32 * self.n_params

    @property
    def gradient_bytes(self) -> int:
        return FP32 * self.n_params

    @property
    def optimizer_bytes(self) -> int:
        """AdamW's state: m and v in fp32, and a step count per parameter tensor."""
        return 2 * FP32 * self.n_params + FP32 * self.n_tensors

    @property
    def checkpoint_bytes(self) -> int:
        """The `.bin`: header, weights, m and v."""
        return payload_size(self.n_params)


def parameters(m: ModelConfig) -> ParameterCount:
    """The parameter count of daemon/model.py's GPT for `m`, exactly."""
    c, v, t = m.n_embd, m.vocab_size, m.block_size
    bias = 1 if m.bias else 0
    # Per layer: ln_1, c_attn (3c x c), attn.c_proj (c x c), ln_2, c_fc (4c x c), mlp.c_proj.
    per_layer = 12 * c * c + 2 * c + bias * (c + 3 * c + c + c + 4 * c + c)
    embeddings = v * c + t * c
    n = embeddings + m.n_layer * per_layer + c * (1 + bias) + v * c
    tensors = 2 + m.n_layer * 6 * (1 + bias) + (1 + bias) + 1
    return ParameterCount(
        n_params=n, n_tensors=tensors, embedding_params=embeddings, block_params=per_layer
    )


def shapes(m: ModelConfig) -> list[tuple[int, ...]]:
    """The shape of each parameter tensor of daemon/model.py's GPT, in its order."""
    c, v = m.n_embd, m.vocab_size
    norm = [(c,), (c,)] if m.bias else [(c,)]

    def linear(out: int, into: int) -> list[tuple[int, ...]]:
        return [(out, into), (out,)] if m.bias else [(out, into)]

    block = [
        *norm,
        *linear(3 * c, c),
        *linear(c, c),
        *norm,
        *linear(4 * c, c),
        *linear(c, 4 * c),
    ]
    return [(v, c), (m.block_size, c), *block * m.n_layer, *norm, (v, c)]


def sharded_elements(m: ModelConfig, ranks: int) -> int:
    """The most parameter elements one of `ranks` ranks holds when each tensor is cut along its
    first dimension into `ranks` pieces of ceil(rows / ranks) rows, as FSDP2's `fully_shard`
    cuts it (the last pieces shorter or padded: rank 0's are full)."""
    out = 0
    for shape in shapes(m):
        rest = 1
        for d in shape[1:]:
            rest *= d
        out += -(-shape[0] // ranks) * rest
    return out


@dataclass(frozen=True)
class Numerics:
    """How a step stores its activations: the precision and kernels it runs with."""

    #: Bytes of an activation element (2 under bf16 autocast, 4 in fp32 and tf32).
    act_bytes: int
    #: "math": attention materialises the B x H x T x T scores; "fused": a flash or
    #: memory-efficient kernel that keeps O(T) per head.
    attention: Literal["math", "fused"]
    #: Bytes of a dropout mask element: 4 for the CPU path's float mask, 1 for CUDA's bool mask.
    mask_bytes: int


def cpu_numerics(m: ModelConfig) -> Numerics:
    """The trainer's CPU step: fp32; attention written out (math) in training with dropout, else
    PyTorch's fused CPU kernel; float dropout masks (daemon/model.py)."""
    return Numerics(FP32, "math" if m.dropout > 0 else "fused", FP32)


def cuda_numerics(precision: str) -> Numerics:
    """The trainer's CUDA step: bf16 autocast unless fp32/tf32; fused attention kernels (flash or
    memory-efficient), in the deterministic mode too (daemon/trainer/platform/determinism.py)."""
    return Numerics(2 if precision == "bf16" else FP32, "fused", 1)


def activation_bytes(
    m: ModelConfig, sequences: int, n: Numerics, recompute: bool | None = None
) -> int:
    """The memory a forward and backward pass of `sequences` sequences of `m.block_size` tokens
    adds at its peak, on one rank (the parameters, gradients and optimizer state aside). With
    activation recompute (`recompute`, default: the model's setting) each block keeps only its
    input, the fp32 residual stream, and one block's activations exist at a time, while it is
    computed again for its backward pass."""
    if recompute is None:
        recompute = m.recompute == "blocks"
    tokens = sequences * m.block_size
    btc, btv = tokens * m.n_embd, tokens * m.vocab_size
    scores = sequences * m.n_head * m.block_size * m.block_size
    a, drop = n.act_bytes, m.dropout > 0
    per_layer = btc * (2 * FP32 + 15 * a)
    if drop:
        per_layer += 2 * btc * n.mask_bytes
    if n.attention == "math":
        per_layer += scores * a + (scores * (n.mask_bytes + a) if drop else 0)
    embeddings = btc * n.mask_bytes if drop else 0
    head = btc * (FP32 + a) + btv * (a + FP32) + 2 * FP32 * btv
    if not recompute:
        return m.n_layer * per_layer + embeddings + head
    # Each block's input is kept; the peak is at the head's backward, or while a block is computed
    # again: its activations, its output, that output's gradient and its input's, with the logits
    # still referenced (the trainer's step holds them until the backward pass is done).
    again = per_layer + 3 * btc * FP32 + btv * a
    return m.n_layer * btc * FP32 + embeddings + max(head, again)


def flops_per_token(m: ModelConfig) -> int:
    """Training FLOPs per token: 6 per weight of the matrix multiplies (forward 2, backward 4),
    embeddings excluded, plus the attention's scores and weighted sums (PaLM's 6N + 12 L T C)."""
    matmul_params = parameters(m).n_params - parameters(m).embedding_params
    return 6 * matmul_params + 12 * m.n_layer * m.block_size * m.n_embd


def recompute_flops_per_token(m: ModelConfig) -> int:
    """The FLOPs per token activation recompute adds: every block's forward pass again (2 per
    weight of its matrices, and its attention's 4 L T C)."""
    return 2 * m.n_layer * parameters(m).block_params + 4 * m.n_layer * m.block_size * m.n_embd
