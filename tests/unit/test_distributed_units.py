"""The pieces of distributed training that need no second process: the torchrun environment, the
agreement in a world of one, per-rank manifest states and CUDA RNG states from other machines."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import torch

from andrea.daemon.checkpoint import rngstate
from andrea.daemon.checkpoint.manifest import DistributedState, RankState
from andrea.daemon.config import ConfigError
from andrea.daemon.runtime.operator_requests import OperatorRequests
from andrea.daemon.trainer.platform.distributed import Coordinator, fingerprint
from andrea.daemon.trainer.platform.world import World


def test_world_of_one_without_torchrun() -> None:
    w = World.from_environ({})
    assert (w.rank, w.size, w.is_main, w.distributed) == (0, 1, True, False)


def test_world_from_torchrun_environment() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
    }
    w = World.from_environ(env)
    assert (w.rank, w.size, w.local_rank, w.local_size, w.node) == (3, 4, 1, 2, 1)
    assert w.distributed and not w.is_main


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "LOCAL_RANK missing"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "inconsistent"),
        ({"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "distributed environment"),
    ],
)
def test_partial_or_inconsistent_environment_is_a_config_error(env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        World.from_environ(env)


def test_agreement_in_a_world_of_one_takes_the_local_requests() -> None:
    flags = OperatorRequests()
    coord = Coordinator(World())
    d = coord.agree(flags, arm=2, loss=1.5, probe=[0, 2])
    assert (d.stop, d.checkpoint, d.boundary, d.arm, d.loss) == (None, None, False, 2, 1.5)
    assert d.probe == (0, 2) and coord.agree(flags, arm=1).probe == ()
    flags.request_checkpoint("sigusr1")
    flags.request_boundary_checkpoint(hold=True)
    d = coord.agree(flags)
    # A boundary request waits for a boundary; a checkpoint request is taken once.
    assert (d.checkpoint, d.boundary, d.hold) == ("sigusr1", False, False)
    d = coord.agree(flags, at_boundary=True)
    assert (d.checkpoint, d.boundary, d.hold) == (None, True, True)
    flags.request_stop("sigterm")
    assert coord.agree(flags).stop == "sigterm"


def test_fingerprint_sees_one_flipped_bit() -> None:
    a = [torch.randn(100), torch.randn(7, 3)]
    b = [t.clone() for t in a]
    assert int(fingerprint(a)) == int(fingerprint(b))
    b[1].view(torch.int32)[2, 1] ^= 1
    assert int(fingerprint(a)) != int(fingerprint(b))


def test_distributed_state_needs_one_state_per_rank() -> None:
    rank = RankState(rank=0, rng=rngstate.capture(), data=[])
    with pytest.raises(ValueError, match="not exactly 0..1"):
        DistributedState(world_size=2, backend="gloo", ranks=[rank])
    DistributedState(
        world_size=2, backend="gloo", ranks=[rank, rank.model_copy(update={"rank": 1})]
    )


def test_cuda_states_of_another_machine_do_not_stop_a_cpu_resume() -> None:
    """A checkpoint from a machine with two GPUs (its manifest lists a generator state per
    device, as before this change) resumes on this CPU: the CPU state is restored exactly and the
    CUDA states are reported as not applicable, never an exception that restarts forever."""
    torch.manual_seed(7)
    state = rngstate.capture(torch.device("cpu"))
    assert state.torch_cuda == [] and state.cuda_device is None
    fake = base64.b64encode(bytes(16)).decode()
    moved = state.model_copy(update={"torch_cuda": [fake, fake]})
    expected = torch.rand(3)
    torch.manual_seed(99)
    notes = rngstate.restore(moved, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)
    assert len(notes) == 1 and "not restored" in notes[0]


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
def test_cuda_state_of_the_device_in_use_round_trips() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.manual_seed(5)
    state = rngstate.capture(dev)
    assert len(state.torch_cuda) == 1 and state.cuda_device == dev.index
    expected = torch.rand(4, device=dev)
    torch.cuda.manual_seed(6)
    assert rngstate.restore(state, dev) == []
    assert torch.equal(torch.rand(4, device=dev), expected)


@cuda
def test_cuda_environment_is_recorded() -> None:
    from andrea.daemon.trainer.platform import cudaenv

    env = cudaenv.describe(torch.device("cuda", 0))
    assert env["gpu"] and env["compute_capability"] and env["cuda_runtime"]
    assert env["cuda_driver"], "the NVIDIA driver version should be readable from /proc"


@cuda
def test_deterministic_mode_repeats_a_training_step_bit_for_bit() -> None:
    from andrea.daemon.config import build_config
    from andrea.daemon.model import GPT
    from andrea.daemon.trainer.platform import determinism

    dev = torch.device("cuda", 0)
    cfg = build_config({}, {"preset": "andrea-tiny"}).model
    grads = []
    determinism.apply(True)
    try:
        for _ in range(2):
            torch.manual_seed(0)
            model = GPT(cfg).to(dev)
            x = torch.randint(0, 256, (8, 65), device=dev)
            with determinism.attention(True, dev), torch.autocast("cuda", torch.bfloat16):
                _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    finally:
        determinism.apply(False)
    assert torch.equal(grads[0], grads[1])


def test_verify_resume_runs_the_trainer_through_torchrun_for_nproc() -> None:
    from andrea.control.verify_resume import main
    from andrea.control.verify_resume.trainer import TrainerLaunch, _trainer_command

    single = _trainer_command(Path("/r"), None)
    assert single[1:4] == ["-B", "-m", "andrea.daemon.trainer.service.cli"]
    assert single[single.index("--device") + 1] == "cpu"
    job = _trainer_command(Path("/r"), None, launch=TrainerLaunch(device="cuda", nproc=2))
    assert Path(job[0]).name == "torchrun" and job[1:4] == ["--standalone", "--nproc-per-node", "2"]
    assert Path(job[job.index("--no-python") + 1]).name == "andrea-trainer"
    assert job[job.index("--device") + 1] == "cuda"
    # torchrun re-raises the SIGTERM it forwarded: the stop path may end with 1.
    assert TrainerLaunch(nproc=2).stop_codes == (0, 1) and TrainerLaunch().stop_codes == (0,)
    with pytest.raises(SystemExit):
        main(["--output", "/nonexistent/x", "--problem", "mini", "--nproc", "2"])
