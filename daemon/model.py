"""The ANDREA GPT: token and position embeddings, pre-norm blocks of attention and MLP, a final norm
and a separate output head.

The order in which modules are declared IS the checkpoint format's parameter order (token and
position embeddings, then per layer: norm, attention, norm, MLP, then the final norm and the head),
so `named_parameters()` can be written to and read from `step_NNNNNN.bin` without a name map.

Speed on CPU (measured, see docs/performance.md): training with dropout > 0 makes PyTorch's
`scaled_dot_product_attention` fall back to its generic math path, and `nn.Dropout`'s CPU kernel
(`native_dropout`: a Bernoulli draw per element from the Mersenne Twister) costs about 5x what the
mask needs. So on CPU, in training, a dropout mask is drawn as 32-bit integers from NumPy's PCG64
(two per 64-bit output, kept where >= round(p * 2**32)), seeded by one 63-bit draw from torch's
global generator per call: the same Bernoulli(1 - p) keep / scale 1 / (1 - p), a pure function of
torch's RNG state (which every checkpoint saves and restores, so resume stays bit-exact) and
independent of the thread count: the stream is drawn in spans on the step's threads, each from a
generator advanced to its span, which changes no bit. Every CPU run with dropout has trained on
these masks; they stay as they are. Attention with dropout is written out (matmul, causal mask,
softmax, dropout, matmul) since SDPA would draw its own mask. Everywhere else — CUDA, evaluation,
dropout 0 — PyTorch's fused kernels are used. `torch.compile` was measured too and made a CPU step
slower here (0.93x), so the `compile` setting's default leaves it off on CPU (on on CUDA).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from andrea.daemon.config import GREEDY_BELOW, ModelConfig


def _cpu_training_dropout(x: torch.Tensor, p: float) -> bool:
    return p > 0.0 and x.device.type == "cpu"


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout. On CPU, the mask comes from a PCG64 stream seeded by torch's RNG (see the module docstring)."""
    if not training or p == 0.0:
        return x
    if not _cpu_training_dropout(x, p):
        return F.dropout(x, p, True)
    return x * _keep_mask(x, p)


def _keep_mask(x: torch.Tensor, p: float) -> torch.Tensor:
    """0 where dropped (probability p, resolution 2**-32), 1 / (1 - p) where kept; shaped like x."""
    seed = int(
        torch.randint(0, 2**63 - 1, (), dtype=torch.int64).item()
    )  # one draw from torch's RNG
    n = x.numel()
    keep = np.empty(n, dtype=np.bool_)
    threshold = np.uint32(min(round(p * 2**32), 2**32 - 1))
    words = (n + 1) // 2  # 64-bit outputs of the stream: element i is half i % 2 of word i // 2

    def fill(span: tuple[int, int]) -> None:
        # Words [lo, hi) of the one stream: a generator advanced to lo draws exactly them.
        lo, hi = span
        stream = np.random.PCG64(seed)
        stream.advance(lo)
        end = min(2 * hi, n)
        bits = stream.random_raw(hi - lo).view(np.uint32)[: end - 2 * lo]
        np.greater_equal(bits, threshold, out=keep[2 * lo : end])

    parts = torch.get_num_threads() if n >= _PARALLEL_MASK else 1
    cuts = [words * i // parts for i in range(parts + 1)]
    spans = list(zip(cuts[:-1], cuts[1:]))
    if parts == 1:
        fill(spans[0])
    else:
        # The draws release the GIL: torch's threads are idle meanwhile, so the mask is drawn on
        # as many threads as the step computes on. The bits do not depend on how it is cut.
        list(_mask_pool(parts).map(fill, spans))
    return torch.from_numpy(keep).view(x.shape).to(x.dtype).mul_(1.0 / (1.0 - p))


#: Masks smaller than this are drawn on the calling thread (a hand-off costs more than the draw).
_PARALLEL_MASK = 1 << 16


@functools.cache
def _mask_pool(workers: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dropout")


class Dropout(nn.Module):
    """`nn.Dropout` with the CPU fast path above; holds no parameters (the format is unchanged)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


_CAUSAL_MASKS: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}


def _causal_mask(t: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(t, t) additive mask: 0 on and below the diagonal, -inf above. Cached (not a buffer, so the
    module's state_dict is its parameters alone)."""
    key = (t, device, dtype)
    mask = _CAUSAL_MASKS.get(key)
    if mask is None:
        mask = torch.full((t, t), float("-inf"), device=device, dtype=dtype).triu_(1)
        _CAUSAL_MASKS[key] = mask
    return mask


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        # One fused projection for q, k, v: one matmul instead of three.
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.training and _cpu_training_dropout(x, self.dropout):
            # What SDPA's math path computes, without its per-call mask building and checks, and
            # with the cheaper dropout draw.
            att = torch.matmul(q * (1.0 / math.sqrt(c // self.n_head)), k.transpose(-2, -1))
            att = torch.softmax(att.add_(_causal_mask(t, x.device, att.dtype)), dim=-1)
            y = torch.matmul(dropout(att, self.dropout, True), v)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = SelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.recompute = cfg.recompute == "blocks"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute and self.training and torch.is_grad_enabled():
            # Activation recompute (not a checkpoint of the run): only x is kept; the backward
            # pass runs `_compute` again. Inside the block's own call, so that a wrapper's hooks
            # on the block (FSDP's gathers) stay outside what is recomputed. preserve_rng_state
            # gives the second run the random state of the first (torch's CPU generator, which
            # seeds the CPU dropout masks, and the generators of x's GPU), so it draws the same
            # masks; afterwards the state is put back as the first run left it. Non-reentrant:
            # autograd's graph is the one without recompute, so every gradient sums in the same
            # order, and the step is bit for bit the one without (tests/unit/test_recompute.py).
            out: torch.Tensor = checkpoint(
                self._compute, x, use_reentrant=False, preserve_rng_state=True
            )
            return out
        return self._compute(x)

    def _compute(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT language model over a byte vocabulary (by default)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        # Not tied to wte: the checkpoint format stores the head as its own array.
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream keeps its
        # variance independent of depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position, and the mean cross-entropy when targets are given."""
        t = idx.shape[1]
        if t > self.cfg.block_size:
            raise ValueError(f"sequence of {t} tokens exceeds block_size {self.cfg.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float = 0.8,
        should_stop: Callable[[], bool] | None = None,
        top_k: int | None = None,
    ) -> torch.Tensor:
        """Sample continuations with a caller-owned generator, so that sampling for audit never
        touches the global RNG that dropout draws from (and so never changes training). The window
        slides at block_size. Fewer than `max_new_tokens` when `should_stop` said stop."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                for _ in range(max_new_tokens):
                    if should_stop is not None and should_stop():
                        break
                    logits, _ = self(idx[:, -self.cfg.block_size :])
                    nxt = next_token(logits[:, -1, :], generator, temperature, top_k)
                    idx = torch.cat([idx, nxt], dim=1)
        finally:
            self.train(was_training)
        return idx

    def decay_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: matrices decay, vectors (biases, norms) do not."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]


def next_token(
    logits: torch.Tensor,
    generator: torch.Generator,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The next id of each row of `logits` (rows × vocabulary): the most likely at temperature 0,
    else drawn with `generator` from the softmax at `temperature`, kept to the `top_k` most likely
    and to the smallest set of mass `top_p`. The one rule of the trainer's samples and of
    `andreactl generate`."""
    if temperature < GREEDY_BELOW:
        # Greedy is the limit; a smaller divisor could overflow the logits (1e-300), whose softmax
        # would be NaN and the draw would fail.
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True, dim=-1)
        mass = F.softmax(ordered, dim=-1)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        drop = (mass.cumsum(dim=-1) - mass) >= top_p
        # Even where top_p rounds to 0 in the logits' float32 (below 1.4e-45).
        drop[..., 0] = False
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs.to(generator.device), 1, generator=generator).to(logits.device)
