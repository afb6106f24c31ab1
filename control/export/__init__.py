"""andreactl export: a checkpoint as a self-contained bundle, or in the Hugging Face layout.

`python -m andrea.control.export` and `from andrea.control.export import load_model` keep
working as they did when the export was one module: the names below are read from `bundle`
on first use, so that importing a sibling (`sources`, `tokenizer`) does not import torch."""

from __future__ import annotations

import importlib
from typing import Any

#: The export's public names, as the exported README and docs/export.md use them.
PUBLIC = (
    "ExportReport",
    "eval_loss",
    "export_checkpoint",
    "load_export_tokenizer",
    "load_model",
    "run_export",
)


def __getattr__(name: str) -> Any:
    if name in PUBLIC:
        return getattr(importlib.import_module(".bundle", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
