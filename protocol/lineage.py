"""Where a run's state came from: the world sizes it trained at, and the checkpoint of another run
it started from (`--init-from`). Every manifest carries it (`lineage`); `andreactl status` and the
export show it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Lineage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorldSpan(_Lineage):
    """A stretch of the run trained by jobs of one size."""

    from_step: int = Field(ge=0, description="the step this stretch started after (0: the start)")
    world_size: int = Field(ge=1, description="processes of the job (torchrun's WORLD_SIZE)")


class InitSource(_Lineage):
    """The checkpoint of another run that a new run started from."""

    path: str = Field(description="the source's .bin, as an absolute path when the run started")
    step: int = Field(ge=1)
    bin_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    manifest_sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the source manifest file's bytes"
    )
    preset: str | None = Field(description="the source run's preset")
    config_hash: str = Field(description="the source run's trajectory hash")
    optimizer: bool = Field(
        description="Adam's moments and step count came too (--init-from-optimizer); else only "
        "the weights"
    )


class Lineage(_Lineage):
    world_sizes: list[WorldSpan] = Field(
        min_length=1, description="each change of world size, in step order"
    )
    init_from: InitSource | None = None

    def at_world(self, step: int, size: int) -> Lineage:
        """This lineage continued by a job of `size` ranks from `step` (unchanged at the same size)."""
        if self.world_sizes[-1].world_size == size:
            return self
        spans = [*self.world_sizes, WorldSpan(from_step=step, world_size=size)]
        return self.model_copy(update={"world_sizes": spans})

    def describe(self) -> str:
        """`world size 2 from the start, 1 after step 8; started from /runs/a/step_000100.bin
        (sha256 1f2e…, weights and Adam's state)`."""
        spans = ", ".join(
            f"{s.world_size} "
            + ("from the start" if s.from_step == 0 else f"after step {s.from_step}")
            for s in self.world_sizes
        )
        text = f"world size {spans}"
        if (src := self.init_from) is not None:
            what = "weights and Adam's state" if src.optimizer else "weights"
            text += f"; started from {src.path} (sha256 {src.bin_sha256[:12]}…, {what})"
        return text
