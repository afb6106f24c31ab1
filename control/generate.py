"""Text from a trained model (``andreactl generate``): the model and tokenizer of a run's checkpoint
or of an export folder, a prompt, and a continuation sampled with a seeded generator.

Only reading: a run's newest intact checkpoint (or exactly ``--step N``) is verified against its
manifest and loaded, nothing in the run directory is written, so it works beside a live trainer.
Sampling draws from a ``torch.Generator`` seeded by ``--seed`` alone, so the same seed, settings
and checkpoint give the same text. A context longer than the model's window (``block_size``) keeps
its newest ``block_size`` tokens: the window slides, and the caller is told.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from andrea.daemon.checkpoint.manager import checkpoint_steps
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import MAX_TEMPERATURE
from andrea.daemon.data.tokenizer import RunTokenizer
from andrea.daemon.model import GPT, next_token

from .export.bundle import REPORT_NAME, ExportRefused, build_model, select_checkpoint
from .export.tokenizer import TokenizerProblem, load_export_tokenizer, run_tokenizer


class GenerateError(ValueError):
    """The source holds no usable checkpoint or tokenizer, or a setting is out of range: one line."""


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen: greedy at temperature 0, else sampled from the softmax at
    ``temperature``, kept to the ``top_k`` most likely and the smallest set of mass ``top_p``."""

    max_new_tokens: int = 128
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 1337

    def check(self) -> None:
        """GenerateError naming the first setting out of range."""
        if self.max_new_tokens < 0:
            raise GenerateError(f"--max-new-tokens {self.max_new_tokens}: must be 0 or more")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:  # NaN included
            raise GenerateError(
                f"--temperature {self.temperature}: must be from 0 (greedy) to {MAX_TEMPERATURE:g}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise GenerateError(f"--top-k {self.top_k}: must be 1 or more")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise GenerateError(f"--top-p {self.top_p}: must be in (0, 1]")


@dataclass
class Loaded:
    """A model ready to generate, its tokenizer, and where they came from."""

    model: GPT
    tokenizer: RunTokenizer
    manifest: Manifest
    source: str


def is_export(folder: Path) -> bool:
    """An export folder (either kind) holds its export.json."""
    return (folder / REPORT_NAME).is_file()


def load_source(folder: Path, step: int | None, device: str) -> Loaded:
    """The checkpoint of ``folder`` (an export, or a run: its newest intact checkpoint or exactly
    ``step``), verified, on ``device`` in eval mode, with its tokenizer. GenerateError otherwise."""
    manifest, weights = _checkpoint(folder, step)
    try:
        if is_export(folder):
            tokenizer = load_export_tokenizer(folder, manifest)
        else:
            tokenizer, _ = run_tokenizer(folder, manifest)
    except (TokenizerProblem, OSError, ValueError) as exc:
        raise GenerateError(str(exc)) from None
    try:
        model = build_model(manifest, weights).to(device)
    except (RuntimeError, ValueError) as exc:
        raise GenerateError(f"--device {device}: {exc}") from None
    kind = "export" if is_export(folder) else "run"
    return Loaded(model, tokenizer, manifest, f"{kind} {folder}, step {manifest.step}")


def _checkpoint(folder: Path, step: int | None) -> tuple[Manifest, np.ndarray]:
    if not checkpoint_steps(folder):
        raise GenerateError(f"no checkpoint in {folder}: give a run directory or an export folder")
    try:
        loaded = select_checkpoint(folder, step)
    except ExportRefused as exc:
        raise GenerateError(str(exc)) from None
    return loaded.manifest, loaded.payload.weights


@torch.no_grad()
def generate_ids(
    loaded: Loaded,
    prompt: list[int],
    sampling: Sampling,
    on_token: Callable[[list[int]], None] | None = None,
    stop: int | None = None,
) -> list[int]:
    """The ``sampling.max_new_tokens`` ids that follow ``prompt``, or fewer: generation ends before
    the id ``stop`` (the tokenizer's end of a document); ``on_token`` sees the continuation so far
    after each one. The window slides at block_size."""
    model = loaded.model
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(sampling.seed)
    idx = torch.tensor([prompt], dtype=torch.long, device=device)
    block = model.cfg.block_size
    out: list[int] = []
    for _ in range(sampling.max_new_tokens):
        logits, _ = model(idx[:, -block:])
        nxt = next_token(
            logits[:, -1, :].float(),
            generator,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
        )
        if int(nxt.item()) == stop:
            break
        idx = torch.cat([idx, nxt], dim=1)
        out.append(int(nxt.item()))
        if on_token is not None:
            on_token(out)
    return out
