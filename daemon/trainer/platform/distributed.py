"""Data-parallel training over torch.distributed, as launched by `torchrun`: who this process is,
the process group, and the few collectives that keep every rank at the same step.

- Rank and world come from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, ...). A
  process started without torchrun, or by torchrun with one worker, is a world of one: no process
  group is created and every collective below is a local no-op, so single-process runs are
  unchanged.
- Backend: gloo on CPU; on CUDA, NCCL for CUDA tensors (DDP's gradients, broadcasts of the state)
  and gloo for CPU tensors (the per-step agreement and the small messages), one device per
  LOCAL_RANK.
- Every step, one all-reduce of a few numbers (`Coordinator.agree`) turns what any rank was asked
  (stop, checkpoint, boundary checkpoint, hold, resume) into one decision taken by all ranks at the
  same step, carries rank 0's arm for the step, and sums the ranks' losses. A flag is 0 or 1 per rank,
  so the sum is positive exactly when the MAX over ranks is 1: the reduction is the MAX over
  [stop, checkpoint, boundary, hold] that the design asks for, in the same collective as the loss.
- Messages between ranks (the config check, the manifest on resume, each rank's RNG and cursor
  states at a checkpoint) travel as JSON in uint8 tensors: no pickle on any path.

A rank never leaves a collective sequence alone: every decision to stop, to checkpoint or to give
up with an error is itself agreed by a collective, so no rank exits while the others wait.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import get_args

import torch

from andrea.daemon.config import ConfigError
from andrea.daemon.runtime.operator_requests import CheckpointReason, OperatorRequests, StopReason
from andrea.daemon.trainer.platform.world import World

log = logging.getLogger(__name__)

#: How long a collective may wait for a slow rank. A rank may spend a checkpoint write (minutes at
#: billions of parameters) or a proxy outage (it polls, so the others see a collective every
#: 0.25 s) before the next collective; 30 minutes is torch's own default for gloo.
COLLECTIVE_TIMEOUT = timedelta(minutes=30)

#: The reasons a stop or a checkpoint can have, in the order that decides which one a rank
#: records when several ranks were asked for different reasons at the same step.
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)
CHECKPOINT_REASONS: tuple[CheckpointReason, ...] = get_args(CheckpointReason)


class DistributedError(RuntimeError):
    """The ranks of a job disagree on something they must share (config, replicas)."""


def device_for(world: World, device: torch.device) -> torch.device:
    """This rank's device: on CUDA, the GPU of its LOCAL_RANK (one per rank), made current."""
    if device.type != "cuda":
        return device
    if not world.distributed:
        return torch.device("cuda", torch.cuda.current_device())
    count = torch.cuda.device_count()
    if world.local_rank >= count:
        raise ConfigError(
            f"local rank {world.local_rank} needs GPU {world.local_rank}, but this node shows {count}; "
            "run at most one process per GPU (--nproc-per-node)"
        )
    torch.cuda.set_device(world.local_rank)
    return torch.device("cuda", world.local_rank)


def backend_for(device: torch.device) -> str:
    # CPU tensors (the agreement, the messages) always go through gloo, also on a CUDA job.
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def init(world: World, device: torch.device) -> str | None:
    """Join the job's process group (a no-op for a world of one); returns the backend."""
    if not world.distributed:
        return None
    import torch.distributed as dist

    backend = backend_for(device)
    dist.init_process_group(
        backend,
        rank=world.rank,
        world_size=world.size,
        timeout=COLLECTIVE_TIMEOUT,
        device_id=device if device.type == "cuda" else None,
    )
    log.info(
        "rank %d of %d (node %d, local rank %d, pid %d) on %s, backend %s",
        world.rank,
        world.size,
        world.node,
        world.local_rank,
        os.getpid(),
        device,
        backend,
    )
    return backend


def shutdown(world: World) -> None:
    """Leave the process group. Only after a clean end of every rank: during an error a rank may
    still wait in a collective, and destroying the group then can hang (torchtitan #1342)."""
    if world.distributed:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


# ---- messages between ranks -------------------------------------------------------------------


def _byte_tensor(data: bytes) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )


def broadcast_bytes(world: World, data: bytes | None) -> bytes:
    """Rank 0's `data` on every rank (the others pass None)."""
    if not world.distributed:
        assert data is not None
        return data
    import torch.distributed as dist

    size = torch.tensor([len(data) if world.is_main and data is not None else 0], dtype=torch.int64)
    dist.broadcast(size, 0)
    buf = (
        _byte_tensor(data)
        if world.is_main and data is not None
        else torch.empty(int(size), dtype=torch.uint8)
    )
    if int(size):
        dist.broadcast(buf, 0)
    return bytes(buf.numpy())


def _padded(world: World, data: bytes) -> tuple[list[int], torch.Tensor]:
    """Every rank's length of `data`, and this rank's `data` padded to the longest: collectives
    move tensors of one size."""
    import torch.distributed as dist

    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world.size)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64))
    lengths = [int(s) for s in sizes]
    mine = torch.zeros(max(lengths), dtype=torch.uint8)
    mine[: len(data)] = _byte_tensor(data)
    return lengths, mine


def gather_bytes(world: World, data: bytes) -> list[bytes] | None:
    """Every rank's `data`, in rank order, on rank 0 (None on the others)."""
    if not world.distributed:
        return [data]
    import torch.distributed as dist

    lengths, mine = _padded(world, data)
    bufs = [torch.empty_like(mine) for _ in range(world.size)] if world.is_main else None
    dist.gather(mine, bufs, dst=0)
    if bufs is None:
        return None
    return [bytes(b[:n].numpy()) for b, n in zip(bufs, lengths, strict=True)]


def all_gather_bytes(world: World, data: bytes) -> list[bytes]:
    """Every rank's `data`, in rank order, on every rank."""
    if not world.distributed:
        return [data]
    import torch.distributed as dist

    lengths, mine = _padded(world, data)
    bufs = [torch.empty_like(mine) for _ in range(world.size)]
    dist.all_gather(bufs, mine)
    return [bytes(b[:n].numpy()) for b, n in zip(bufs, lengths, strict=True)]


def agree_code(world: World, code: int) -> int:
    """The largest of the ranks' codes: an outcome (0 = carry on, else an exit code) all ranks
    act on together, so that an error on one rank ends every rank instead of stranding them."""
    if not world.distributed:
        return code
    import torch.distributed as dist

    t = torch.tensor([code], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def check_same(world: World, what: str, value: str) -> None:
    """DistributedError naming the ranks whose `value` differs from rank 0's."""
    values = all_gather_bytes(world, value.encode())
    odd = [r for r, v in enumerate(values) if v != values[0]]
    if odd:
        raise DistributedError(
            f"ranks disagree on {what}: rank 0 has {values[0].decode()!r}, "
            + ", ".join(f"rank {r} has {values[r].decode()!r}" for r in odd)
        )


# ---- replicas --------------------------------------------------------------------------------


def fingerprint(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """An int64 checksum of the tensors' float32 bits, exact and order-independent per tensor:
    DDP keeps replicas bit-identical, so any difference in any bit shows up (barring a collision
    of sums, which a silent divergence would not produce for long)."""
    total = torch.zeros((), dtype=torch.int64, device=tensors[0].device if tensors else "cpu")
    for t in tensors:
        total += t.detach().contiguous().view(torch.int32).sum(dtype=torch.int64)
    return total


def check_replicas(world: World, groups: Mapping[str, Sequence[torch.Tensor]]) -> None:
    """Before a write: DistributedError when any rank's weights, m or v differ from rank 0's.
    One pass over the state on its device and one all-gather of a few integers."""
    if not world.distributed:
        return
    import torch.distributed as dist

    local = torch.stack([fingerprint(ts) for ts in groups.values()]).cpu()
    gathered = [torch.zeros_like(local) for _ in range(world.size)]
    dist.all_gather(gathered, local)
    odd = {
        r: [name for i, name in enumerate(groups) if int(g[i]) != int(gathered[0][i])]
        for r, g in enumerate(gathered)
    }
    odd = {r: names for r, names in odd.items() if names}
    if odd:
        raise DistributedError(
            "replicas diverged (nothing was written): "
            + "; ".join(
                f"rank {r} differs from rank 0 in {', '.join(n)}" for r, n in sorted(odd.items())
            )
        )


def broadcast_tensors(world: World, tensors: list[torch.Tensor]) -> None:
    """Overwrite every rank's tensors with rank 0's (in place)."""
    if not world.distributed:
        return
    import torch.distributed as dist

    for t in tensors:
        dist.broadcast(t, 0)


# ---- the per-step agreement ------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What every rank does at this step boundary, the same on all ranks."""

    stop: StopReason | None = None
    checkpoint: CheckpointReason | None = None
    boundary: bool = False
    hold: bool = False
    resume: bool = False
    arm: int | None = None
    loss: float | None = None
    #: The arms (by index) whose target probe follows the next step: rank 0's, from the proxy.
    probe: tuple[int, ...] = ()


_N_FLAGS = len(STOP_REASONS) + len(CHECKPOINT_REASONS) + 3  # + boundary, hold, resume
_ARM = 1 + _N_FLAGS
_LEN = _ARM + 1


class Coordinator:
    """One all-reduce per step boundary over [loss, stop reasons, checkpoint reasons, boundary,
    hold, resume, rank 0's arm + 1, one probe flag per arm]. In a world of one it reads the local
    flags and costs nothing."""

    def __init__(self, world: World, enabled: bool = True, arms: int = 0) -> None:
        self.world = world
        # `enabled=False` exists for one purpose: measuring what the collective costs per step
        # (tests/bench/bench_distributed.py). Such a run cannot stop in step on a rank's signal.
        self.enabled = enabled
        # The probe flags ride in the same collective: under FSDP every rank must join a probe's
        # forward pass, and only rank 0 hears the proxy ask for one.
        self._buf = torch.zeros(_LEN + arms, dtype=torch.float64)

    def agree(
        self,
        flags: OperatorRequests,
        *,
        at_boundary: bool = False,
        holding: bool = False,
        arm: int | None = None,
        loss: float | None = None,
        probe: Sequence[int] = (),
    ) -> Decision:
        """Take this rank's pending requests and agree on them with every other rank.

        `at_boundary`: a boundary checkpoint may be taken here (it stays pending otherwise);
        `holding`: a resume request may be taken; `arm` is rank 0's arm for the next step (None:
        not known yet); `loss`: this rank's loss of the step just trained; `probe`: rank 0's arms
        (indices) whose target probe follows the next step."""
        stop = flags.stop_reason
        ckpt = flags.take_checkpoint_request()
        boundary, hold = flags.take_boundary_request() if at_boundary else (False, False)
        resume = flags.take_resume() if holding else False
        if not (self.world.distributed and self.enabled):
            return Decision(stop, ckpt, boundary, hold, resume, arm, loss, tuple(probe))
        import torch.distributed as dist

        b = self._buf
        b.zero_()
        b[0] = loss if loss is not None else 0.0
        if stop is not None:
            b[1 + STOP_REASONS.index(stop)] = 1
        if ckpt is not None:
            b[1 + len(STOP_REASONS) + CHECKPOINT_REASONS.index(ckpt)] = 1
        o = 1 + len(STOP_REASONS) + len(CHECKPOINT_REASONS)
        b[o], b[o + 1], b[o + 2] = float(boundary), float(hold), float(resume)
        if self.world.is_main and arm is not None:
            b[_ARM] = arm + 1
            for i in probe:
                b[_LEN + i] = 1
        dist.all_reduce(b, op=dist.ReduceOp.SUM)
        v = b.tolist()
        stops = [r for i, r in enumerate(STOP_REASONS) if v[1 + i] > 0]
        ckpts = [r for i, r in enumerate(CHECKPOINT_REASONS) if v[1 + len(STOP_REASONS) + i] > 0]
        agreed_stop = stop if stop is not None else (stops[0] if stops else None)
        if agreed_stop is not None and flags.stop_reason is None:
            # Another rank's signal: this rank is stopping too, and says so to long operations.
            flags.request_stop(agreed_stop)
        return Decision(
            stop=agreed_stop,
            checkpoint=ckpts[0] if ckpts else None,
            boundary=v[o] > 0,
            hold=v[o + 1] > 0,
            resume=v[o + 2] > 0,
            arm=int(v[_ARM]) - 1 if v[_ARM] > 0 else None,
            loss=v[0] / self.world.size if loss is not None else None,
            probe=tuple(i for i, flag in enumerate(v[_LEN:]) if flag > 0),
        )

    def mean_loss(self, loss: float) -> float:
        """The mean over the ranks of this rank's `loss`, by one collective of every rank: the
        loss of a step that no agreement carried. Summed in the agreement's buffer at the
        agreement's place, so that a step's mean has the same bits whichever of the two carried
        it (at three ranks or more the order of a sum is the place's)."""
        if not (self.world.distributed and self.enabled):
            return loss
        import torch.distributed as dist

        b = self._buf
        b.zero_()
        b[0] = loss
        dist.all_reduce(b, op=dist.ReduceOp.SUM)
        return b.tolist()[0] / self.world.size
