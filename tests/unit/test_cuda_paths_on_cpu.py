"""The CUDA branches that need no GPU to execute, run on the CPU with what a CUDA machine would
give them: a `torch.device("cuda")` that nothing is ever allocated on, a manifest written on a GPU.
scripts/cuda_lines.py lists the CUDA-only lines; docs/performance.md says which need a driver."""

from __future__ import annotations

import base64

import pytest
import torch

from andrea.daemon.checkpoint import rngstate
from andrea.daemon.config import ConfigError
from andrea.daemon.trainer.platform import determinism, distributed, precision

CUDA = torch.device("cuda")


def test_deterministic_attention_on_cuda_allows_flash_efficient_and_math_not_cudnn(
    monkeypatch,
) -> None:
    monkeypatch.delenv(determinism.BENCH_BACKENDS_ENV, raising=False)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with determinism.attention(True, CUDA):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_a_rank_whose_gpu_the_node_lacks_is_refused() -> None:
    shown = torch.cuda.device_count()
    # A job of two ranks on this node whose second rank's GPU is one past the node's last.
    world = distributed.World(rank=1, size=2, local_rank=shown, local_size=2)
    with pytest.raises(
        ConfigError, match=f"local rank {shown} needs GPU {shown}, but this node shows {shown}"
    ):
        distributed.device_for(world, CUDA)


def test_tf32_and_auto_on_cuda_are_tensor_core_modes() -> None:
    assert precision.resolve("tf32", CUDA) is precision.TF32
    auto = precision.resolve("auto", CUDA)
    assert auto in (precision.BF16_CUDA, precision.TF32)
    if not torch.cuda.is_bf16_supported():
        # A device that cannot say bfloat16 is supported gets TF32, not fp32's "highest".
        assert auto is precision.TF32


def _from_a_gpu(state: rngstate.RngState, devices: int) -> rngstate.RngState:
    """`state` as a GPU machine's manifest holds it: one CUDA generator state per device, as
    older manifests saved them (or the one of the device in use), and that device's index."""
    cuda_states = [base64.b64encode(bytes([i]) * 16).decode() for i in range(devices)]
    return state.model_copy(update={"torch_cuda": cuda_states, "cuda_device": 0})


# On a GPU the states really go to the device (a missing device 2 would fail); there
# tests/unit/test_distributed_units.py's CUDA round trip covers this path.
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only run of the CUDA branch")
def test_a_gpu_manifests_generator_goes_to_the_device_in_use_or_device_0s_is_named() -> None:
    state = rngstate.capture(torch.device("cpu"))
    expected = torch.rand(3)
    assert rngstate.restore(_from_a_gpu(state, 1), torch.device("cuda", 0)) == []
    assert torch.equal(torch.rand(3), expected)  # the CPU generator is restored alongside
    assert rngstate.restore(_from_a_gpu(state, 2), torch.device("cuda", 1)) == []
    notes = rngstate.restore(_from_a_gpu(state, 2), torch.device("cuda", 2))
    assert notes == [
        "the checkpoint holds CUDA generator states for 2 devices and none for device 2; "
        "device 0's was restored"
    ]
