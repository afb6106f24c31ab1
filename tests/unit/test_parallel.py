"""The parallelism seam (daemon/trainer/parallel/) without a second process: which strategy a
config and a world give, the streamed staging FSDP's gather writes into, and FSDP2 itself in a
process group of one rank (gloo over an in-memory store, in this process): its gather writes the
same bytes as the plain model's copy, and its restore brings a payload back exactly."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manager import layout_of
from andrea.daemon.checkpoint.manifest import Environment
from andrea.daemon.checkpoint.writer import StagingBuffer
from andrea.daemon.config import ConfigError, build_config
from andrea.daemon.model import GPT
from andrea.daemon.trainer.parallel import STRATEGIES, Strategy, strategy_for
from andrea.daemon.trainer.parallel.ddp import DDP
from andrea.daemon.trainer.parallel.fsdp import FSDP
from andrea.daemon.trainer.parts import adamw
from andrea.daemon.trainer.platform.environment import EXACTNESS_FIELDS
from andrea.daemon.trainer.platform.precision import FP32
from andrea.daemon.trainer.platform.world import World

CPU = torch.device("cpu")


def test_the_config_names_a_strategy_and_a_single_process_ignores_it() -> None:
    assert build_config({}).distributed.strategy == "ddp"
    assert build_config({"distributed": {"strategy": "fsdp"}}).distributed.strategy == "fsdp"
    with pytest.raises((ConfigError, ValueError)):
        build_config({"distributed": {"strategy": "zero3"}})
    assert set(STRATEGIES) == {"ddp", "fsdp"}
    job = World(rank=1, size=2, local_rank=1, local_size=2)
    assert type(strategy_for("fsdp", job, CPU, FP32)) is FSDP
    assert type(strategy_for("ddp", job, CPU, FP32)) is DDP
    alone = strategy_for("fsdp", World(), CPU, FP32)
    assert type(alone) is Strategy and not alone.joint_forward
    assert FSDP.joint_forward and FSDP.sharding == "fsdp" and DDP.sharding == "replicated"


def test_sharding_is_an_exactness_field_and_old_manifests_read_as_replicated() -> None:
    assert "sharding" in EXACTNESS_FIELDS
    old = {"device": "cpu", "dtype": "float32", "threads": 1, "torch_version": "2"}
    old |= {"numpy_version": "2", "python_version": "3", "code_version": "x"}
    assert Environment.model_validate(old).sharding == "replicated"


def test_the_trivial_strategy_syncs_nothing_and_sees_a_non_finite_weight() -> None:
    s = Strategy(World(), CPU, FP32)
    with s.sync(last=False):
        pass
    ok, bad = torch.ones(3), torch.tensor([1.0, float("inf")])
    assert s.weights_finite([ok]) and not s.weights_finite([ok, bad])
    assert s.gather([ok], ([ok], [ok]), [0], None, 1) is False


def test_streamed_staging_writes_the_bytes_of_the_whole_copy() -> None:
    tensors = [torch.randn(3, 4), torch.randn(5)]
    n = sum(t.numel() for t in tensors)
    m, v = [t * 2 for t in tensors], [t * t for t in tensors]
    whole = StagingBuffer(n).fill(7, tensors, m, v).copy()
    streamed = StagingBuffer(n)
    streamed.begin(7)
    offsets = [0, 12]
    for part, arrays in enumerate((tensors, m, v)):
        for t, off in zip(arrays, offsets):
            streamed.put(part, off, t)
    assert streamed.array.tobytes() == whole.tobytes()
    with pytest.raises(checkpoint_format.PayloadError):
        streamed.put(0, 0, torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="outside the payload"):
        streamed.put(2, 14, torch.ones(4))


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo process group of one rank in this process, destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _trained(model: torch.nn.Module, optimizer, strategy: Strategy, steps: int = 2) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        xy = torch.randint(0, 256, (2, 9), generator=g)
        optimizer.zero_grad()
        for last in (False, True):  # two micro-batches, the sync on the last
            with strategy.sync(last):
                _, loss = model(xy[:, :-1], xy[:, 1:])
                (loss / 2).backward()
        strategy.clip(list(model.parameters()), 1.0)
        optimizer.step()


@pytest.mark.usefixtures("one_rank_group")
def test_fsdp_gathers_the_bytes_of_the_plain_model_and_restores_them() -> None:
    cfg = build_config({"model": {"vocab_size": 257, "dropout": 0.0}})
    world = World()  # one rank: the strategy is built directly, as a job would
    torch.manual_seed(1)
    plain = GPT(cfg.model)
    torch.manual_seed(1)
    sharded = GPT(cfg.model)
    base = Strategy(world, CPU, FP32)
    popt = adamw(plain, cfg.optim)
    _trained(plain, popt, base)

    fsdp = FSDP(world, CPU, FP32)
    wrapped = fsdp.wrap(sharded, adamw(sharded, cfg.optim), False, lambda m: adamw(m, cfg.optim))
    _trained(wrapped.forward, wrapped.optimizer, fsdp)
    layout = layout_of((n, tuple(p.shape)) for n, p in plain.named_parameters())
    offsets = [e.offset for e in layout]
    n = plain.n_params()

    def staged(strategy: Strategy, params, optimizer) -> np.ndarray:
        buf = StagingBuffer(n)
        states = [optimizer.state[p] for p in params]
        moments = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states])
        if not strategy.gather(params, moments, offsets, buf, 2):
            buf.fill(2, params, *moments)
        return buf.array.copy()

    want = staged(base, list(plain.parameters()), popt)
    got = staged(fsdp, wrapped.params, wrapped.optimizer)
    assert got.tobytes() == want.tobytes()
    assert fsdp.weights_finite(wrapped.params)

    # The restore: the plain model's state, loaded before the wrap, comes back whole.
    torch.manual_seed(2)
    again = GPT(cfg.model)
    opt = adamw(again, cfg.optim)
    with torch.no_grad():
        for dst, src in zip(again.parameters(), plain.parameters()):
            dst.copy_(src)
    for dst, src in zip(again.parameters(), plain.parameters()):
        opt.state[dst] = {k: t.clone() for k, t in popt.state[src].items()}
    fresh = FSDP(world, CPU, FP32)
    restored = fresh.wrap(again, opt, True, lambda m: adamw(m, cfg.optim))
    assert staged(fresh, restored.params, restored.optimizer).tobytes() == want.tobytes()
