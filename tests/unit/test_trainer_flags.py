"""andrea-trainer's flags: each config flag derived from the setting it sets, the names kept as the
command-line contract, and the README's usage block held to the parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from andrea.daemon.config import build_config, run_toml_header
from andrea.daemon.trainer.service.cli import build_parser
from andrea.daemon.trainer.service.flags import CONFIG_FLAGS, config_overrides, field_at

README = Path(__file__).resolve().parents[2] / "README.md"

#: The flags scripts, units and docs rely on (DESIGN.md's command-line contract): a rename fails here.
CONTRACT = {
    "--run-dir", "--config", "--preset", "--max-steps", "--checkpoint-every", "--seed", "--device",
    "--precision", "--mixing", "--with-proxy", "--policy", "--pivot", "--threads", "--batch-size",
    "--grad-accum", "--eval-every", "--heldout-fraction", "--compile", "--decay-steps",
    "--log-every", "--sample-every", "--cache-dir", "--allow-config-change", "--deterministic",
    "--log-level", "--init-from", "--init-from-optimizer", "--init-from-other-tokenizer", "--check", "--world-size",
    "--tokenizer", "--proxy-grace", "--recompute", "--strategy", "--windows",
}  # fmt: skip


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every documented option of the parser (not --help, not the hidden unsafe ones)."""
    return {
        max(a.option_strings, key=len): a
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS and a.dest != "help"
    }


def _placeholder(action: argparse.Action) -> str | None:
    """What follows the flag in a usage line: nothing, `a|b|c` for choices, else its metavar."""
    if action.nargs == 0:
        return None
    if action.choices:
        return "|".join(action.choices)
    return action.metavar


def _readme_usage() -> dict[str, str | None]:
    """The flags of the README's andrea-trainer usage block, with the placeholder each shows."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"^andrea-trainer --run-dir.*?(?=^\S)", text, re.M | re.S)
    assert block, "README.md has no andrea-trainer usage block"
    found = re.findall(r"(--[a-z-]+)(?: ([^\s\[\]]+))?", block.group(0))
    flags = [f for f, _ in found]
    assert len(flags) == len(set(flags)), f"a flag listed twice in README.md: {flags}"
    return {f: v or None for f, v in found}


def test_the_flag_names_are_the_contract() -> None:
    assert set(_options(build_parser())) == CONTRACT


def test_the_readme_usage_block_lists_every_flag_as_the_parser_takes_it() -> None:
    parser = {f: _placeholder(a) for f, a in _options(build_parser()).items()}
    readme = _readme_usage()
    assert sorted(set(parser) - set(readme)) == [], "flags missing from README.md's usage block"
    assert sorted(set(readme) - set(parser)) == [], "README.md lists flags the parser lacks"
    assert {f: v for f, v in readme.items() if parser[f] != v} == {}, (
        "README.md shows these flags' values unlike the parser, which takes "
        + str({f: parser[f] for f, v in readme.items() if parser[f] != v})
    )


def test_each_config_flag_is_described_by_its_setting() -> None:
    actions = _options(build_parser())
    for flag in CONFIG_FLAGS:
        field = field_at(flag.path)
        action = actions[flag.flag]
        assert field.description, f"{flag.path} has no description for {flag.flag}'s help"
        assert action.help.startswith(field.description), flag.flag
        assert action.default is None, f"{flag.flag} must not override run.toml unless given"
    text = " ".join(build_parser().format_help().split())
    assert "(default: INFO)" in text and "(checkpoint.every; default: 100; N >= 0)" in text
    # batch_size: the presets' default (theirs differ: 8 sequences, the GPT-3 shapes' 512 and
    # 1,024), its range
    assert "(default: the preset's; 1 <= N <= 4096)" in text
    assert "default: the preset's" in text  # decay_steps differs between presets


def test_batch_size_has_one_definition_used_by_its_flag_run_toml_and_the_docs() -> None:
    meaning = field_at("batch_size").description
    assert meaning and meaning.startswith("sequences per optimizer step over the whole job")
    assert _options(build_parser())["--batch-size"].help.startswith(meaning)
    for doc in ("README.md", "docs/distributed.md", "docs/evaluation.md"):
        text = " ".join((README.parent / doc).read_text(encoding="utf-8").split())
        assert meaning in text, f"{doc} does not give batch_size's one definition"
    header = run_toml_header({"batch_size_per": "step"})
    assert meaning in " ".join(line.lstrip("# ") for line in header.splitlines())
    # A run created under the per-micro-batch reading is told so in its own file.
    assert "per micro-batch" in run_toml_header({})


@pytest.mark.parametrize("flag", CONFIG_FLAGS, ids=lambda f: f.flag)
def test_each_config_flag_sets_its_setting(flag) -> None:
    values = {"preset": "andrea-12m", "device": "cpu", "precision": "fp32", "mixing": "proxy"}
    values |= {"compile": "off", "deterministic": "on", "data.cache_dir": "/tmp/c"}
    values |= {"model.recompute": "blocks"}
    values |= {"distributed.strategy": "fsdp", "data.windows": "fixed"}
    values |= {"data.heldout_fraction": "0.25", "optim.decay_steps": "3000"}  # past the warmup
    given = values.get(flag.path, "3")
    args = build_parser().parse_args(["--run-dir", "r", flag.flag, given])
    overrides = config_overrides(args)
    cfg = build_config({}, overrides)
    node = cfg
    for part in flag.path.split("."):
        node = getattr(node, part)
    assert str(node) == given
    others = build_parser().parse_args(["--run-dir", "r"])
    assert config_overrides(others) == {}


def test_the_readmes_first_run_has_a_schedule_that_matches_it() -> None:
    """Issue 24, item 25: the README's first command trained 300 steps under andrea-tiny's
    2,000-step LR decay, and greeted a newcomer with a WARNING about its own settings. Its flags,
    as the README spells them, give a run whose schedule ends with it."""
    from andrea.daemon.trainer.schedule import disagreement

    text = README.read_text(encoding="utf-8")
    first = re.search(r"^\./scripts/setup\.sh && \.venv/bin/andrea-trainer (.+)$", text, re.M)
    assert first, "README.md's first command is not the trainer's"
    args = build_parser().parse_args(first.group(1).split())
    assert args.with_proxy and args.run_dir == Path("runs/demo")
    overrides = config_overrides(args)
    overrides["mixing"] = "proxy"
    cfg = build_config({}, overrides)
    assert disagreement(cfg.optim, cfg.max_steps) is None
    # Long enough to try `andreactl status`, Ctrl-C and the resume the README describes: at 33 ms
    # of CPU per step (measured, trainer and proxy together), 3,000 steps last about a minute.
    assert cfg.max_steps >= 3000


@pytest.mark.parametrize("max_steps", [10, 500])
def test_the_advice_of_a_run_shorter_than_its_decay_can_be_followed(max_steps: int) -> None:
    """The warning's --decay-steps is one the config accepts: never before the warmup's end."""
    from andrea.daemon.trainer.schedule import disagreement

    cfg = build_config({}, {"preset": "andrea-tiny", "max_steps": max_steps})
    advice = disagreement(cfg.optim, max_steps)
    assert advice is not None
    decay = int(re.search(r"--decay-steps (\d+)", advice)[1])  # type: ignore[index]
    assert decay == max(max_steps, cfg.optim.warmup_steps)
    build_config(
        {}, {"preset": "andrea-tiny", "max_steps": max_steps, "optim": {"decay_steps": decay}}
    )
