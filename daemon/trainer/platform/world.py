"""Who this process is in a job: rank, world size and its place on its node, as torchrun describes
them in the environment (distributed.py has the process group and the collectives). Apart from
them, and without torch, so that a start refused for its environment or its config is refused
before torch's import (2-3 s of CPU)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from andrea.daemon.config import ConfigError


@dataclass(frozen=True)
class World:
    """This process's place in the job: global rank, world size, and its place on its node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node: int = 0

    @property
    def is_main(self) -> bool:
        """Global rank 0: owns the control socket, the proxy link, the loss log and the writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @classmethod
    def from_environ(cls, env: dict[str, str] | None = None) -> World:
        """The world torchrun describes in the environment; a world of one without it.
        ConfigError when the variables are partial or inconsistent."""
        env = dict(os.environ if env is None else env)
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
        present = [n for n in names if n in env]
        if not present:
            return cls()
        if len(present) != len(names):
            missing = sorted(set(names) - set(present))
            raise ConfigError(
                f"incomplete distributed environment: {', '.join(present)} set but {', '.join(missing)} "
                "missing; launch with torchrun, or unset them for a single process"
            )
        try:
            rank, size, local = (int(env[n]) for n in names)
            local_size = int(env.get("LOCAL_WORLD_SIZE", size))
            node = int(env.get("GROUP_RANK", 0))
        except ValueError as e:
            raise ConfigError(f"distributed environment: {e}") from None
        if not (0 <= rank < size and 0 <= local < local_size <= size):
            raise ConfigError(
                f"distributed environment is inconsistent: RANK={rank} WORLD_SIZE={size} "
                f"LOCAL_RANK={local} LOCAL_WORLD_SIZE={local_size}"
            )
        return cls(rank, size, local, local_size, node)
