"""The deterministic mode: what it switches on and off, and what it leaves alone on CPU. The CUDA
half (which attention kernels run, and that their backward repeats) needs a GPU and is skipped
without one; scripts/gpu_check.py runs it."""

from __future__ import annotations

import os

import pytest
import torch

from andrea.daemon.trainer.platform import determinism

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def restore_mode():
    yield
    determinism.apply(False)


def test_on_switches_the_algorithms_on_and_the_fill_of_new_memory_off(restore_mode) -> None:
    determinism.apply(True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.utils.deterministic.fill_uninitialized_memory is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"]
    determinism.apply(False)
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic


def test_auto_means_on_for_cuda_only() -> None:
    assert determinism.resolve("auto", CUDA) and not determinism.resolve("auto", CPU)
    assert determinism.resolve("on", CPU) and not determinism.resolve("off", CUDA)


def test_nccl_is_pinned_only_for_cuda_with_the_mode_on() -> None:
    assert determinism.collective_environment(True, CUDA) == {
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "Simple",
    }
    assert determinism.collective_environment(False, CUDA) == {}
    assert determinism.collective_environment(True, CPU) == {}


def test_pinning_keeps_what_the_operator_set(monkeypatch, caplog) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    determinism.pin_collectives(True, CUDA)
    assert os.environ["NCCL_ALGO"] == "Tree" and os.environ["NCCL_PROTO"] == "Simple"
    assert "NCCL_ALGO=Tree set by the operator" in caplog.text


def test_the_mode_switches_inductor_deterministic_too(restore_mode, monkeypatch) -> None:
    import torch._inductor.config as inductor_config

    monkeypatch.delenv(determinism.INDUCTOR_ENV, raising=False)
    determinism.apply(True)
    assert inductor_config.deterministic is True
    assert os.environ[determinism.INDUCTOR_ENV] == "1"
    monkeypatch.delenv(determinism.INDUCTOR_ENV)
    determinism.apply(False)
    assert inductor_config.deterministic is False


def test_forced_backends_name_the_enum_members(monkeypatch) -> None:
    from torch.nn.attention import SDPBackend

    monkeypatch.setenv(determinism.BENCH_BACKENDS_ENV, "MATH")
    assert determinism.attention(True, torch.device("cuda")) is not None
    assert determinism.forced_backends("flash_attention, MATH") == [
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.MATH,
    ]
    with pytest.raises(ValueError, match="not SDPA backend names"):
        determinism.forced_backends("MATHS")


def test_forced_math_backend_applies_on_cpu_too(monkeypatch) -> None:
    """The CPU dry run of scripts/gpu_check.py goes through the forced path: with only the
    efficient backend allowed, CPU attention (which has no such kernel) must refuse."""
    q = torch.randn(1, 2, 8, 4)
    monkeypatch.setenv(determinism.BENCH_BACKENDS_ENV, "MATH")
    with determinism.attention(False, CPU):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    monkeypatch.setenv(determinism.BENCH_BACKENDS_ENV, "EFFICIENT_ATTENTION")
    with pytest.raises(RuntimeError), determinism.attention(False, CPU):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


def test_cpu_attention_runs_unrestricted() -> None:
    with determinism.attention(True, CPU):
        q = torch.randn(1, 2, 8, 4)
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _attention_backward(seed: int) -> tuple[torch.Tensor, set[str]]:
    """dQ of a causal bf16 attention of andrea-120m's shape (12 heads of 64, 1,024 positions),
    under the mode, and the CUDA kernels that ran."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator(device=CUDA).manual_seed(seed)
    shape = (4, 12, 1024, 64)
    q, k, v = (
        torch.randn(shape, device=CUDA, dtype=torch.bfloat16, generator=g).requires_grad_()
        for _ in range(3)
    )
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with determinism.attention(True, CUDA):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.float().pow(2).sum().backward()
        torch.cuda.synchronize()
    return q.grad.clone(), {e.name for e in prof.events()}


@cuda
def test_flash_attention_runs_and_its_backward_repeats_under_the_mode(restore_mode) -> None:
    determinism.apply(True)
    first, kernels = _attention_backward(0)
    second, _ = _attention_backward(0)
    assert any("flash" in k.lower() for k in kernels), sorted(kernels)
    assert torch.equal(first, second)
