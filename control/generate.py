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

from andrea.control.export.bundle import REPORT_NAME, ExportRefused, build_model, select_checkpoint
from andrea.control.export.hf import HF_DIR
from andrea.control.export.tokenizer import TokenizerProblem, load_export_tokenizer, run_tokenizer
from andrea.daemon.checkpoint.manager import checkpoint_steps
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import MAX_TEMPERATURE, SEED_LIMIT
from andrea.daemon.data.tokenizer import RunTokenizer
from andrea.daemon.model import GPT, next_token

#: The most tokens one continuation may have: far beyond a page of text, and a bound on a typo's
#: run time (10**12 would sample for ever).
MAX_NEW_TOKENS = 1 << 16
#: The kinds of torch device a model generates on (the trainer's own choices).
DEVICE_TYPES = ("cpu", "cuda")


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
        if not 0 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise GenerateError(
                f"--max-new-tokens {self.max_new_tokens}: must be from 0 to {MAX_NEW_TOKENS:,}"
            )
        if not 0 <= self.temperature <= MAX_TEMPERATURE:  # NaN included
            raise GenerateError(
                f"--temperature {self.temperature}: must be from 0 (greedy) to {MAX_TEMPERATURE:g}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise GenerateError(f"--top-k {self.top_k}: must be 1 or more")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise GenerateError(f"--top-p {self.top_p}: must be in (0, 1]")
        if not 0 <= self.seed < SEED_LIMIT:
            # A negative seed would wrap to another one silently; the trainer's --seed refuses it.
            raise GenerateError(
                f"--seed {self.seed}: must be from 0 to 2**63 - 1 (as the trainer's)"
            )


@dataclass
class Loaded:
    """A model ready to generate, its tokenizer, and where they came from."""

    model: GPT
    tokenizer: RunTokenizer
    manifest: Manifest
    source: str
    #: Newer checkpoints that were damaged and passed over, each with why.
    skipped: list[str]


def is_export(folder: Path) -> bool:
    """An export folder (either kind) holds its export.json."""
    return (folder / REPORT_NAME).is_file()


def load_source(folder: Path, step: int | None, device: str) -> Loaded:
    """The checkpoint of ``folder`` (an export, or a run: its newest intact checkpoint or exactly
    ``step``), verified, on ``device`` in eval mode, with its tokenizer. GenerateError otherwise."""
    where = torch_device(device)
    manifest, weights, skipped = _checkpoint(folder, step)
    try:
        if is_export(folder):
            tokenizer = load_export_tokenizer(folder, manifest)
        else:
            tokenizer, _ = run_tokenizer(folder, manifest)
    except (TokenizerProblem, OSError, ValueError) as exc:
        raise GenerateError(str(exc)) from None
    try:
        model = build_model(manifest, weights).to(where)
    except (RuntimeError, ValueError) as exc:
        raise GenerateError(f"--device {device}: {exc}") from None
    kind = "export" if is_export(folder) else "run"
    return Loaded(model, tokenizer, manifest, f"{kind} {folder}, step {manifest.step}", skipped)


def torch_device(device: str) -> torch.device:
    """The torch device ``--device`` names, when a model can generate there: the CPU, or a CUDA
    device this machine has. GenerateError naming it otherwise (``meta`` holds no data)."""
    try:
        where = torch.device(device)
    except RuntimeError:
        raise GenerateError(
            f"--device {device}: not a torch device (cpu, cuda, cuda:1, ...)"
        ) from None
    if where.type not in DEVICE_TYPES:
        raise GenerateError(
            f"--device {device}: a model generates on {' or '.join(DEVICE_TYPES)}, not {where.type}"
        )
    if where.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise GenerateError(f"--device {device}: this machine has no CUDA device torch can use")
        if where.index is not None and where.index >= count:
            raise GenerateError(
                f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    return where


def _checkpoint(folder: Path, step: int | None) -> tuple[Manifest, np.ndarray, list[str]]:
    if not checkpoint_steps(folder):
        if folder.name == HF_DIR and is_export(folder.parent):
            raise GenerateError(
                f"{folder} is the Hugging Face folder of the export {folder.parent}, which holds "
                f"the checkpoint: give --export-dir {folder.parent}"
            )
        raise GenerateError(f"no checkpoint in {folder}: give a run directory or an export folder")
    try:
        loaded = select_checkpoint(folder, step)
    except ExportRefused as exc:
        raise GenerateError(str(exc)) from None
    return loaded.manifest, loaded.payload.weights, loaded.skipped


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
