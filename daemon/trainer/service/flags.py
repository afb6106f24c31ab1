"""The trainer's config flags, derived from `RunConfig`: one table maps each flag to its setting.

A flag's type, choices, help and displayed default come from the pydantic field it sets (its
annotation, its `description`, its constraints, and the presets' or the field's default), so a
setting is declared once, in daemon/config.py. The flag names are the command-line contract
(docs/architecture.md, README.md): they are written here, never derived. The argparse default of
every flag is None, meaning "not given": only a flag that was given overrides run.toml.

Range checks stay with pydantic: a value out of range is a config error naming the setting and
blaming the command line, exactly as one from run.toml is named.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from andrea.daemon.config import PRESETS, RunConfig


@dataclass(frozen=True)
class ConfigFlag:
    """One command-line flag that sets one `RunConfig` setting."""

    flag: str
    #: Dotted path of the setting in `RunConfig` (and run.toml): `checkpoint.every`.
    path: str
    #: Placeholder in usage and help; by default N for integers, F for floats.
    metavar: str | None = None


#: Every config flag of andrea-trainer, in the order `--help` lists them.
CONFIG_FLAGS: tuple[ConfigFlag, ...] = (
    ConfigFlag("--preset", "preset", metavar="|".join(PRESETS)),
    ConfigFlag("--max-steps", "max_steps"),
    ConfigFlag("--checkpoint-every", "checkpoint.every"),
    ConfigFlag("--seed", "seed"),
    ConfigFlag("--device", "device"),
    ConfigFlag("--precision", "precision"),
    ConfigFlag("--mixing", "mixing"),
    ConfigFlag("--threads", "threads"),
    ConfigFlag("--batch-size", "batch_size"),
    ConfigFlag("--grad-accum", "grad_accum"),
    ConfigFlag("--eval-every", "eval.every"),
    ConfigFlag("--heldout-fraction", "data.heldout_fraction"),
    ConfigFlag("--windows", "data.windows"),
    ConfigFlag("--tokenizer", "data.tokenizer", metavar="tokenizer.json|bytes"),
    ConfigFlag("--compile", "compile"),
    ConfigFlag("--recompute", "model.recompute"),
    ConfigFlag("--decay-steps", "optim.decay_steps"),
    ConfigFlag("--log-every", "log_every"),
    ConfigFlag("--sample-every", "samples.every"),
    ConfigFlag("--cache-dir", "data.cache_dir", metavar="DIR"),
    ConfigFlag("--deterministic", "deterministic"),
    ConfigFlag("--strategy", "distributed.strategy"),
)


def field_at(path: str) -> FieldInfo:
    """The pydantic field of `RunConfig` at a dotted path (`checkpoint.every`)."""
    model: type[BaseModel] = RunConfig
    *parents, name = path.split(".")
    for part in parents:
        section = model.model_fields[part].annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            raise ValueError(f"{path}: {part!r} is not a section of the config")
        model = section
    return model.model_fields[name]


def _dest(flag: ConfigFlag) -> str:
    return flag.flag.removeprefix("--").replace("-", "_")


def _value_type(field: FieldInfo) -> Any:
    """The field's type without None (a setting that may be absent is given as a value)."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    return annotation


def _constraints(field: FieldInfo, name: str) -> str:
    """The field's range, as `1 <= N <= 4096` or `N >= 0`; empty without one."""
    lower: tuple[str, Any] | None = None  # (operator as in `name >= 1`, bound)
    upper: tuple[str, Any] | None = None
    for c in field.metadata:
        if isinstance(c, annotated_types.Ge):
            lower = (">=", c.ge)
        elif isinstance(c, annotated_types.Gt):
            lower = (">", c.gt)
        elif isinstance(c, annotated_types.Le):
            upper = ("<=", c.le)
        elif isinstance(c, annotated_types.Lt):
            upper = ("<", c.lt)
    if lower and upper:
        low = f"{_number(lower[1])} {lower[0].replace('>', '<')} "
        return f"{low}{name} {upper[0]} {_number(upper[1])}"
    bound = lower or upper
    return f"{name} {bound[0]} {_number(bound[1])}" if bound else ""


def _number(value: Any) -> str:
    if isinstance(value, int) and value > 2**20 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return str(value)


def _default(path: str, field: FieldInfo) -> str:
    """The default a run gets without the flag or run.toml: the presets', else the field's. Empty
    when the field has none (its description says what absence means)."""
    in_presets = [_preset_value(p, path) for p in PRESETS.values()]
    if all(v is not None for v in in_presets):
        return str(in_presets[0]) if len(set(in_presets)) == 1 else "the preset's"
    return "" if field.default is None else str(field.default)


def _preset_value(preset: dict[str, Any], path: str) -> Any:
    node: Any = preset
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _help(flag: ConfigFlag, field: FieldInfo, metavar: str) -> str:
    # Where the flag's name is not the setting's, the help names the run.toml key it sets.
    notes = [flag.path] if flag.path != _dest(flag) else []
    notes += [f"default: {d}" for d in [_default(flag.path, field)] if d]
    if rng := _constraints(field, metavar):
        notes.append(rng)
    text = field.description or ""
    if notes:
        text += f" ({'; '.join(notes)})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add every flag of `CONFIG_FLAGS` to `parser`, each described by the field it sets."""
    for flag in CONFIG_FLAGS:
        field = field_at(flag.path)
        value_type = _value_type(field)
        kwargs: dict[str, Any] = {"dest": _dest(flag), "default": None}
        if typing.get_origin(value_type) is Literal:
            kwargs["choices"] = list(typing.get_args(value_type))
            metavar = "|".join(kwargs["choices"])
        else:
            kwargs["type"] = value_type
            metavar = flag.metavar or {int: "N", float: "F"}.get(value_type, "VALUE")
            kwargs["metavar"] = metavar
        parser.add_argument(flag.flag, help=_help(flag, field, metavar), **kwargs)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, nested as in run.toml: `{"checkpoint": {"every":
    10}}`. Flags not given are left out, so that run.toml's values stand."""
    out: dict[str, Any] = {}
    for flag in CONFIG_FLAGS:
        value = getattr(args, _dest(flag))
        if value is None:
            continue
        if flag.path == "data.cache_dir":
            # A path on the command line is the working directory's; in run.toml, the run's.
            value = os.path.abspath(os.path.expanduser(value))
        *parents, name = flag.path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = value
    return out
