"""The model card of a Hugging Face export: the ``README.md`` of ``DEST/hf``, the folder pushed to
the Hub (docs/export.md#the-hugging-face-format---format-hf).

- its YAML front matter, which the Hub reads: ``license``, ``language`` and ``datasets`` from the
  ``[export]`` table of the run's ``run.toml`` (``andrea.daemon.config.ExportConfig``), read when
  the export is made, then andrea's own keys (step, tokens, arms, held-out losses, lineage, the
  checkpoint's sha256, the command);
- what the model is and how far it reaches: the context, and what transformers does past it;
- the mixture it trained on: each arm's steps and share of the tokens, per phase, counted on the
  run's loss log up to the exported step, and the pivots between phases.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from andrea.control.export.hf import HF_DIR, default_new_tokens
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import ConfigError, ExportConfig, load_toml
from andrea.daemon.data.arms import CursorState
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.data.tokenizer import RunTokenizer
from andrea.daemon.rundir.evallog import EvalEntry
from andrea.daemon.rundir.layout import CONFIG_FILE, LOSS_FILE
from andrea.daemon.rundir.losslog import LossLogError, read_curve
from andrea.daemon.runtime.validation_messages import describe

#: What transformers raises past the model's last position (GPT-2's position embedding).
PAST_CONTEXT_ERROR = "IndexError: index out of range in self"


class CardProblem(ValueError):
    """The run's ``[export]`` table cannot be used: one message naming the file and the key."""


def export_metadata(run_dir: Path) -> ExportConfig:
    """The ``[export]`` table of ``run_dir``'s run.toml, validated (empty when there is none)."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return ExportConfig()
    try:
        table = load_toml(path, follow_symlinks=False).get("export", {})
        return ExportConfig.model_validate(table)
    except ConfigError as exc:
        raise CardProblem(str(exc)) from None
    except ValidationError as exc:
        raise CardProblem(describe(exc, f"{path}: [export]")) from None


@dataclass
class Phase:
    """The steps of one phase up to the exported step: each arm's (steps, tokens)."""

    phase: int
    first: int
    last: int
    arms: dict[str, tuple[int, int]] = field(default_factory=dict)


@dataclass
class Mixture:
    """What the run trained on, step by step, as its loss log records it."""

    phases: list[Phase]
    pivots: list[tuple[int, int, str]]  # (last step of the old phase, new phase, its policy)
    note: str  # where the figures come from, or why there are none


def mixture(run_dir: Path, step: int) -> Mixture:
    """Each phase's arms, steps and tokens up to ``step`` (the canonical loss log's entries), and
    the pivots recorded under ``archive/``; a Mixture without phases when the log is unreadable."""
    from andrea.control.run_events import read_run_events

    try:
        curve = read_curve(run_dir / LOSS_FILE)
    except (OSError, LossLogError, OverflowError) as exc:
        return Mixture([], [], f"not recorded: the run's {LOSS_FILE} cannot be read ({exc})")
    keep = curve.step <= step
    steps, arms = curve.step[keep], curve.arm[keep]
    phases_of, tokens = curve.phase[keep], curve.tokens[keep]
    phases: list[Phase] = []
    for p in sorted(set(phases_of.tolist())):
        mine = phases_of == p
        counts = {
            str(a): (int(np.sum(arms[mine] == a)), int(np.sum(tokens[mine & (arms == a)])))
            for a in sorted(set(arms[mine].tolist()))
        }
        phases.append(Phase(int(p), int(steps[mine].min()), int(steps[mine].max()), counts))
    pivots = [
        (pv.step, pv.phase, pv.policy_fingerprint)
        for pv in read_run_events(run_dir, curve).pivots
        if pv.step < step
    ]
    gaps = step - len(steps)
    note = f"{len(steps):,} steps of the run's {LOSS_FILE} up to step {step:,}" + (
        f" ({gaps:,} steps have no entry)" if gaps > 0 else ""
    )
    return Mixture(phases, pivots, note)


def _shares(arms: dict[str, tuple[int, int]]) -> dict[str, float]:
    total = sum(t for _, t in arms.values())
    return {a: round(t / total, 4) if total else 0.0 for a, (_, t) in arms.items()}


def _mixture_lines(mix: Mixture, mixing: str, weights: dict[str, float]) -> list[str]:
    """The card's section on the mixture: a table per phase, then the pivots."""
    how = (
        "andrea-proxy's bandit chose each step's arm"
        if mixing == "proxy"
        else "each step's arm was drawn from the arms' configured weights, "
        + ", ".join(f"`{a}` {w:g}" for a, w in weights.items())
    )
    lines = ["## Training data mixture", "", f"Mixing: `{mixing}`: {how}.", ""]
    if not mix.phases:
        return [*lines, f"Shares: {mix.note}.", ""]
    lines += [f"Shares of the tokens trained, from {mix.note}:", ""]
    for ph in mix.phases:
        shares = _shares(ph.arms)
        lines += [
            f"Phase {ph.phase}, steps {ph.first:,}-{ph.last:,}:",
            "",
            "| arm | steps | tokens | share |",
            "|---|---|---|---|",
            *(
                f"| `{a}` | {s:,} | {t:,} | {shares[a]:.1%} |"
                for a, (s, t) in sorted(ph.arms.items())
            ),
            "",
        ]
    if mix.pivots:
        lines.append("Pivots (a new mixing policy from the next step on, `andreactl pivot`):")
        lines.append("")
        lines += [f"- after step {s:,}: phase {p}, policy `{fp[:16]}`" for s, p, fp in mix.pivots]
    else:
        lines.append("Pivots: none (one mixing policy throughout).")
    return [*lines, ""]


def _yaml(value: Any) -> str:
    # JSON is YAML: every value of the front matter written as JSON needs no YAML library.
    return json.dumps(value, ensure_ascii=False)


def _settings(kind: object) -> frozenset[str]:
    found = kinds.find(kind)
    return found.settings if found is not None else frozenset()


def card_arms(config: dict[str, Any], data: Sequence[CursorState]) -> list[dict[str, Any]]:
    """Each arm of a checkpoint (its resolved ``config`` and the cursors of its ``data``): name,
    identity (sha256), tokens, and its source as configured, without the settings its kind has
    not (a text arm has no dtype: only a tokens file has one) nor those left unset."""
    arms_config = {a.get("name"): a for a in config.get("data", {}).get("arms", [])}

    def source(spec: dict[str, Any]) -> dict[str, Any]:
        return {
            k: v
            for k, v in spec.items()
            if k != "name"
            and v not in (None, [])
            and (k != "dtype" or "dtype" in _settings(spec.get("kind")))
        }

    return [
        {
            "name": c.name,
            "identity_sha256": c.identity,
            "tokens": c.n_tokens,
            "source": source(arms_config.get(c.name, {})),
        }
        for c in data
    ]


def _front_matter(
    manifest: Manifest,
    meta: ExportConfig,
    held_out: dict[str, float] | None,
    mix: Mixture,
    command: str,
    tokenizer: RunTokenizer,
) -> list[str]:
    hub: dict[str, Any] = meta.model_dump(exclude_none=True, exclude_defaults=True)
    last = mix.phases[-1] if mix.phases else None
    front = {
        **hub,
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "tags": ["andrea", "gpt2"],
        "andrea_step": manifest.step,
        "andrea_tokens_seen": manifest.progress.tokens_seen,
        "andrea_tokenizer": tokenizer.identity,
        "andrea_arms": card_arms(manifest.config, manifest.data),
        "andrea_mixture": _shares(last.arms) if last is not None else None,
        "andrea_pivots": [{"after_step": s, "phase": p} for s, p, _ in mix.pivots],
        "andrea_held_out_loss": held_out,
        "andrea_lineage": manifest.lineage_or_default().model_dump(mode="json"),
        "andrea_checkpoint_sha256": manifest.bin_sha256,
        "andrea_command": command,
    }
    return ["---", *(f"{k}: {_yaml(v)}" for k, v in front.items()), "---", ""]


def _context_lines(block: int) -> list[str]:
    new = default_new_tokens(block)
    return [
        "## Context",
        "",
        f"The model has {block:,} positions (`n_positions`): a prompt's tokens and the new ones "
        f"together must stay within them. `generation_config.json` makes {new} new tokens the "
        f"default, so that a prompt of up to {block - new:,} tokens stays inside. Past position "
        f"{block:,}, transformers warns that the call \"has exceeded the model's predefined "
        f'maximum length ({block})", then raises `{PAST_CONTEXT_ERROR}`: GPT-2 has no position '
        "beyond its last. For a longer text, give the model its last tokens only:",
        "",
        "```python",
        f'ids = tok(text, return_tensors="pt").input_ids[:, -({block} - max_new_tokens):]',
        "```",
        "",
    ]


def model_card(
    manifest: Manifest,
    evals: Sequence[EvalEntry],
    command: str,
    tokenizer: RunTokenizer,
    meta: ExportConfig,
    mix: Mixture,
) -> str:
    """``DEST/hf/README.md``: the Hub's front matter, then the card's sections (the model and its
    context, steps, tokens, held-out losses, data identity, mixture and pivots, the command)."""
    held = next((e for e in reversed(evals) if e.step == manifest.step), None)
    held_out = {n: a.loss for n, a in held.arms.items()} if held else None
    config = manifest.config
    arms = card_arms(config, manifest.data)
    weights = {
        str(a.get("name")): a.get("weight", 1.0) for a in config.get("data", {}).get("arms", [])
    }
    held_line = (
        "held-out loss at this step: "
        + ", ".join(f"`{n}` {v:.4f}" for n, v in sorted(held_out.items()))
        + " (mean cross-entropy, nats per token, on the run's held-out documents)"
        if held_out
        else "held-out loss at this step: none recorded (the run evaluated no held-out split then)"
    )
    lines = _front_matter(manifest, meta, held_out, mix, command, tokenizer)
    lines += [
        f"# ANDREA GPT, step {manifest.step} (Hugging Face format)",
        "",
        "This folder loads with `transformers` alone (a `GPT2LMHeadModel`):",
        "",
        "```python",
        "from transformers import pipeline",
        'print(pipeline("text-generation", model=".")("The ", max_new_tokens=32)[0]["generated_text"])',
        "```",
        "",
        *_context_lines(manifest.model.block_size),
        "## Training",
        "",
        f"- trained for {manifest.step:,} steps, {manifest.progress.tokens_seen:,} tokens",
        f"- {held_line}",
        "- data: " + "; ".join(f"`{a['name']}` (sha256 `{a['identity_sha256']}`)" for a in arms),
        f"- made by: `{command}`",
        "",
        *_mixture_lines(mix, str(config.get("mixing", "fixed")), weights),
        "## The andrea files",
        "",
        f"This folder holds only what the Hub reads. The andrea export it is part of (the folder "
        f"above `{HF_DIR}/`) holds the checkpoint with its optimizer state, the records to resume "
        "training from it, the audit trail and `export.json`, which proves every file; its "
        "`README.md` says how to load and resume it.",
        "",
    ]
    return "\n".join(lines)
