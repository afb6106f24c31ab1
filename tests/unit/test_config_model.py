"""Presets, config validation, and the model's parameter order (the checkpoint format's order)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from andrea.control.export.card import CardProblem, export_metadata
from andrea.daemon.config import (
    ConfigError,
    ExportConfig,
    RunConfig,
    build_config,
    evaluation_changes,
)
from andrea.daemon.model import GPT


def n_params(preset: str) -> int:
    with torch.device("meta"):  # the 120M model without allocating it
        return GPT(build_config(overrides={"preset": preset}).model).n_params()


def test_preset_parameter_counts() -> None:
    assert n_params("andrea-tiny") == 136_960
    assert abs(n_params("andrea-12m") - 12_800_000) <= 0.02 * 12_800_000
    assert abs(n_params("andrea-120m") - 120_000_000) <= 0.02 * 120_000_000


@pytest.mark.parametrize(
    "preset, layers, width, heads",
    [("gpt3-1.3b", 24, 2048, 16), ("gpt3-6.7b", 32, 4096, 32)],
)
def test_the_gpt3_shapes_build_on_the_meta_device(
    preset: str, layers: int, width: int, heads: int
) -> None:
    cfg = build_config(overrides={"preset": preset})
    m = cfg.model
    assert (m.n_layer, m.n_embd, m.n_head, m.block_size, m.dropout) == (
        layers,
        width,
        heads,
        2048,
        0,
    )
    with torch.device("meta"):  # 5 and 26 GB of fp32 weights: never allocated
        gpt = GPT(m)
    assert all(p.is_meta for p in gpt.parameters())
    # By hand: per block two norms (weight and bias), the q/k/v projection, the attention's output
    # projection and the 4x MLP, each with a bias; the embeddings of 256 ids and 2,048 positions,
    # the final norm and the untied head.
    c = width
    block = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    expected = 256 * c + 2048 * c + layers * block + 2 * c + 256 * c
    assert gpt.n_params() == expected
    assert expected == {"gpt3-1.3b": 1_213_845_504, "gpt3-6.7b": 6_454_648_832}[preset]
    # The paper's batch: 1M and 2M tokens a step.
    assert cfg.batch_size * m.block_size == {"gpt3-1.3b": 2**20, "gpt3-6.7b": 2**21}[preset]


def test_parameter_order_follows_the_format_spec() -> None:
    cfg = build_config(overrides={"preset": "andrea-tiny"})
    names = [n for n, _ in GPT(cfg.model).named_parameters()]
    per_layer = [
        "ln_1.weight",
        "ln_1.bias",
        "attn.c_attn.weight",
        "attn.c_attn.bias",
        "attn.c_proj.weight",
        "attn.c_proj.bias",
        "ln_2.weight",
        "ln_2.bias",
        "mlp.c_fc.weight",
        "mlp.c_fc.bias",
        "mlp.c_proj.weight",
        "mlp.c_proj.bias",
    ]
    expected = ["wte.weight", "wpe.weight"]
    for i in range(cfg.model.n_layer):
        expected += [f"blocks.{i}.{n}" for n in per_layer]
    expected += ["ln_f.weight", "ln_f.bias", "lm_head.weight"]
    assert names == expected


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"optim\.lrr: unknown key"):
        build_config({"optim": {"lrr": 0.1}})
    with pytest.raises(ConfigError, match=r"checkpoint\.keep_latest"):
        build_config({"checkpoint": {"keep_latest": 1}})
    with pytest.raises(ConfigError, match="unknown preset"):
        build_config(overrides={"preset": "andrea-7b"})


def test_file_then_flags_override_the_preset() -> None:
    cfg = build_config(
        {"preset": "andrea-12m", "batch_size": 4, "optim": {"lr": 0.01}}, {"batch_size": 2}
    )
    assert cfg.model.n_embd == 416 and cfg.batch_size == 2 and cfg.optim.lr == 0.01
    assert cfg.optim.warmup_steps == 200  # untouched preset value survives the partial override


def test_operational_settings_do_not_change_the_trajectory_hash() -> None:
    a = build_config(overrides={"max_steps": 10, "log_every": 1})
    b = build_config(overrides={"max_steps": 99999, "checkpoint": {"every": 7}, "threads": 1})
    c = build_config(overrides={"seed": 7})
    assert a.trajectory_hash() == b.trajectory_hash() != c.trajectory_hash()


def test_a_change_of_the_evaluations_is_named_where_the_bandit_reads_them() -> None:
    proxy = {"mixing": "proxy", "checkpoint": {"every": 100}}
    old = build_config(overrides=proxy).model_dump(mode="json")  # eval.every: the checkpoint's
    assert evaluation_changes(old, build_config(overrides=proxy)) == []
    # The same cadence spelt out is no change; another cadence or sequence count is.
    assert evaluation_changes(old, build_config(overrides={**proxy, "eval": {"every": 100}})) == []
    changed = build_config(overrides={**proxy, "eval": {"every": 50, "sequences": 32}})
    assert evaluation_changes(old, changed) == [
        "evaluation every 100 steps → 50",
        "eval.sequences: 64 → 32",
    ]
    # A new checkpoint cadence moves the evaluations that follow it.
    moved = build_config(overrides={"mixing": "proxy", "checkpoint": {"every": 30}})
    assert evaluation_changes(old, moved) == ["evaluation every 100 steps → 30"]
    # The fixed mixture never reads them; a dump without evaluation settings says nothing.
    fixed = build_config(overrides={"checkpoint": {"every": 100}}).model_dump(mode="json")
    assert evaluation_changes(fixed, build_config(overrides={"eval": {"every": 5}})) == []
    assert evaluation_changes({k: v for k, v in old.items() if k != "eval"}, changed) == []


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cpu_dropout_masks_are_one_pcg64_stream_at_any_thread_count(threads: int) -> None:
    """The masks every CPU run with dropout has trained on (daemon/model.py): one PCG64 stream,
    seeded by one draw from torch's generator, two 32-bit halves per 64-bit output, kept where
    >= round(p * 2**32). Drawing it on several threads must not move a bit, or old runs would no
    longer resume exactly."""
    import numpy as np

    from andrea.daemon.model import dropout

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for shape, p in [((8, 8, 256, 256), 0.1), ((3, 65_537), 0.5), ((5,), 0.25)]:
            x = torch.randn(shape)
            torch.manual_seed(11)
            got = dropout(x, p, training=True)
            torch.manual_seed(11)
            seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64).item())
            n = x.numel()
            bits = np.random.PCG64(seed).random_raw((n + 1) // 2).view(np.uint32)[:n]
            keep = torch.from_numpy(bits >= np.uint32(round(p * 2**32))).view(shape)
            assert torch.equal(got, x * keep.to(x.dtype).mul_(1.0 / (1.0 - p)))
    finally:
        torch.set_num_threads(before)


def test_a_change_to_the_bytes_tokenizer_is_named_bytes() -> None:
    """Issue 33, B15: a trajectory leaves the bytes tokenizer out (older runs' hash), and the
    change was shown as "tokenizer.json → absent"."""
    from andrea.daemon.config import build_config, config_changes

    own = build_config({"data": {"tokenizer": "tokenizer.json"}}).trajectory()
    plain = build_config({}).trajectory()
    assert "data.tokenizer: tokenizer.json → bytes" in config_changes(own, plain)
    assert "data.tokenizer: bytes → tokenizer.json" in config_changes(plain, own)
    assert not any("absent" in c for c in config_changes(own, plain))


def test_samples_settings_have_their_defaults_and_ranges() -> None:
    cfg = build_config({})
    assert (cfg.samples.every, cfg.samples.max_new_tokens) == (100, 120)
    assert cfg.samples.prompts is None and cfg.samples.top_k is None
    cfg = build_config({"samples": {"prompts": ["def f(", "The"], "temperature": 0, "top_k": 5}})
    assert cfg.samples.prompts == ["def f(", "The"] and cfg.samples.temperature == 0.0
    for bad, key in [
        ({"prompts": []}, "samples.prompts"),
        ({"prompts": [""]}, r"samples.prompts.0"),
        ({"prompts": ["x" * 1025]}, r"samples.prompts.0"),
        ({"prompts": ["x"] * 65}, "samples.prompts"),
        ({"max_new_tokens": 0}, "samples.max_new_tokens"),
        ({"max_new_tokens": 4097}, "samples.max_new_tokens"),
        ({"temperature": -0.1}, "samples.temperature"),
        ({"temperature": float("nan")}, "samples.temperature"),
        ({"top_k": 0}, "samples.top_k"),
        ({"promts": ["x"]}, r"samples.promts: unknown key"),
    ]:
        with pytest.raises(ConfigError, match=key):
            build_config({"samples": bad})


def test_a_run_toml_older_than_the_samples_table_loads_as_it_meant() -> None:
    """Runs created before `[samples]` wrote `sample_every` and `sample_tokens` at the top of
    their run.toml: they load (as samples.every and samples.max_new_tokens), a flag still
    overrides them, the trajectory is untouched, and two values for one setting are refused."""
    old = build_config({"sample_every": 7, "sample_tokens": 33})
    assert (old.samples.every, old.samples.max_new_tokens) == (7, 33)
    assert old.trajectory_hash() == build_config({}).trajectory_hash()
    flagged = build_config({"sample_every": 7}, {"samples": {"every": 0}})
    assert flagged.samples.every == 0
    assert build_config({"sample_every": 7, "samples": {"every": 7}}).samples.every == 7
    with pytest.raises(ConfigError, match=r"sample_every = 7 and samples.every = 8"):
        build_config({"sample_every": 7, "samples": {"every": 8}})
    # A config dump read back (a manifest's, say) goes through the same upgrade.
    dump = build_config({}).model_dump(mode="json")
    del dump["samples"]
    dump |= {"sample_every": 3, "sample_tokens": 4}
    assert RunConfig.model_validate(dump).samples.max_new_tokens == 4


@pytest.mark.parametrize("weight", [float("inf"), float("nan"), 1e308, -1.0])
def test_an_arm_weight_that_cannot_be_a_share_is_refused(weight: float) -> None:
    # inf (or 1e308, whose sum overflows) gave every step to one arm, and "Infinity" to the manifest.
    arms = [{"name": "a", "kind": "text", "paths": ["a/*"], "weight": weight}]
    with pytest.raises(ConfigError, match=r"data\.arms\.0\.weight"):
        build_config({"data": {"arms": arms}})


@pytest.mark.parametrize(
    "optim, named",
    [
        ({"lr": 0.001, "min_lr": 0.5}, "min_lr 0.5 is above lr 0.001"),
        ({"warmup_steps": 5000, "decay_steps": 10}, "warmup_steps 5000 is past decay_steps 10"),
    ],
)
def test_a_schedule_that_contradicts_itself_is_refused(optim: dict, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        build_config({"optim": optim})
    build_config({"optim": {"lr": 0.001, "min_lr": 0.001, "warmup_steps": 10, "decay_steps": 10}})


def test_a_thread_count_no_machine_has_is_refused() -> None:
    # --threads 100000 aborted in torch's thread pool after being recorded in run.toml.
    with pytest.raises(ConfigError, match="threads"):
        build_config({"threads": 100_000})
    assert build_config({"threads": 64}).threads == 64


def test_a_runs_record_takes_in_what_the_person_edited_since(tmp_path) -> None:
    """Issue 50: run.toml is the person's and never rewritten; the run's resolved config is
    recorded beside it, and a start with checkpoints takes from run.toml only what changed since
    the record took it in (`.run.applied.toml`)."""
    from andrea.daemon.config import read_record, record_resolved, record_trajectory

    run_toml = tmp_path / "run.toml"
    mine = "# mine\nseed = 7\n[optim]\nlr = 0.003\n[eval]\nsequences = 32\n"
    run_toml.write_text(mine)
    record_resolved(
        build_config({"seed": 7, "optim": {"lr": 0.003}}, {"threads": 2}), tmp_path, run_toml
    )
    assert run_toml.read_text() == mine
    # A flag's change accepted since: it stands while the file is unchanged.
    record_trajectory(build_config({"seed": 7, "optim": {"lr": 0.002}}), tmp_path, run_toml)
    record = read_record(tmp_path)
    assert record is not None and record.path.name == ".run.resolved.toml"
    values = record.with_edits(
        {"seed": 7, "optim": {"lr": 0.003}, "eval": {"sequences": 32}}, run_toml
    )
    assert values["optim"]["lr"] == 0.002 and values["threads"] == 2  # a first start's flag, kept
    # An edit is taken, key by key; a removed key falls back to its default.
    values = record.with_edits({"seed": 9, "optim": {"lr": 0.003}}, run_toml)
    assert values["seed"] == 9 and values["optim"]["lr"] == 0.002 and "eval" not in values
    # No file at all: the record as it is.
    assert record.with_edits(None, run_toml)["seed"] == 7
    # A changed preset is refused: a run keeps its model.
    with pytest.raises(ConfigError, match="sets preset andrea-12m, and this run .* is andrea-tiny"):
        record.with_edits({"preset": "andrea-12m", "seed": 7}, run_toml)
    assert run_toml.read_text() == mine


def test_an_earlier_versions_run_toml_is_its_record(tmp_path) -> None:
    """A run directory of an earlier version has no .run.resolved.toml: its run.toml, which that
    trainer rewrote into the resolved config, is the record, and changes nothing by itself."""
    from andrea.daemon.config import read_record, save_config

    save_config(build_config({"seed": 5}), tmp_path / "run.toml")
    record = read_record(tmp_path)
    assert record is not None and record.path.name == "run.toml"
    now = dict(record.values)
    assert record.with_edits(now, tmp_path / "run.toml") == record.values


def test_the_export_table_is_validated_and_changes_no_trajectory(tmp_path: Path) -> None:
    """[export]: the model card's Hub metadata, checked at every start and when exporting."""
    meta = {"license": "apache-2.0", "language": ["en", "pt-BR"], "datasets": ["org/corpus"]}
    cfg = build_config({"export": meta})
    assert cfg.export is not None and cfg.export.language == ["en", "pt-BR"]
    assert cfg.trajectory_hash() == build_config().trajectory_hash()
    for bad, named in [
        ({"language": "en"}, "export.language"),
        ({"language": ["English!"]}, "export.language.0"),
        ({"licence": "mit"}, "export.licence: unknown key"),
        ({"datasets": ["a/b/c"]}, "export.datasets.0"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(named)):
            build_config({"export": bad})
    (tmp_path / "run.toml").write_text('[export]\nlicense = "MIT License"\n')
    with pytest.raises(CardProblem, match=re.escape(f"{tmp_path / 'run.toml'}: [export]")):
        export_metadata(tmp_path)
    (tmp_path / "run.toml").write_text('[export]\nlicense = "mit"\nlanguage = ["en"]\n')
    assert export_metadata(tmp_path) == ExportConfig(license="mit", language=["en"])
    (tmp_path / "run.toml").unlink()
    assert export_metadata(tmp_path) == ExportConfig()
