"""`andreactl export --format hf`: a folder that transformers loads, in a fresh process where
andrea's package cannot be imported, with andrea's logits, greedy tokens and token ids, without a
warning, and with a default length that stays inside the context; the folder holds only what the
Hub reads, its model card the run.toml's [export] metadata and the mixture."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from andrea.control.export.bundle import load_model
from andrea.control.export.tokenizer import load_export_tokenizer
from andrea.daemon.config import DEFAULT_FRACTION
from andrea.daemon.data.corpus import extract_stdlib_documents, stdlib_files, stdlib_root
from andrea.daemon.data.heldout import is_held_out
from tests.support.daemons import REPO, andreactl, run_trainer

BLOCK = 128
NEW_TOKENS = 64
#: What a user's `python` sees: no andrea (a finder refuses it), no network, no working directory.
LOADER = r"""
import importlib.abc, json, sys
class NoAndrea(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "andrea" or name.startswith("andrea."):
            raise ImportError("andrea is hidden from this process")
sys.meta_path.insert(0, NoAndrea())
try:
    import andrea  # noqa: F401
    sys.exit("andrea is importable")
except ImportError:
    pass
import logging, warnings
import numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
def fresh():  # as in a process of its own: a warning shown once before may show again
    warnings.onceregistry.clear()
    for module in list(sys.modules.values()):
        registry = getattr(module, "__dict__", {}).get("__warningregistry__")
        if isinstance(registry, dict):
            registry.clear()
    getattr(logging.Logger.warning_once, "cache_clear", lambda: None)()
def load(folder, work):
  job = json.load(open(work + "/job.json"))
  model = AutoModelForCausalLM.from_pretrained(folder).eval()
  tok = AutoTokenizer.from_pretrained(folder)
  prompt = torch.tensor([job["prompt"]])
  with torch.no_grad():
      logits = model(torch.tensor(np.load(work + "/rows.npy"))).logits
      np.save(work + "/logits.npy", logits.float().numpy())
      out = model.generate(prompt, max_new_tokens=job["new"], do_sample=False)
      default = model.generate(prompt)  # the folder's own default length
  text = pipeline("text-generation", model=folder)("The ", max_new_tokens=16)[0]["generated_text"]
  batch = None
  if job["batch"]:  # padded with the end-of-document token: a batch of two prompts of two lengths
      runs = pipeline("text-generation", model=folder, batch_size=2)
      batch = [o[0]["generated_text"] for o in runs(["The ", "def main("], max_new_tokens=8)]
  print("--- past the context ---", file=sys.stderr)  # what comes after it is expected to warn
  try:
      with torch.no_grad():
          model.generate(prompt, max_new_tokens=job["past"])
      past = "no error"
  except IndexError as e:
      past = f"IndexError: {e}"
  json.dump({
      "greedy": out[0].tolist()[len(job["prompt"]):],
      "default_new": default.shape[1] - len(job["prompt"]),
      "past": past,
      "ids": [tok(d)["input_ids"] for d in job["docs"]],
      "pipeline": text,
      "batch": batch,
  }, open(work + "/got.json", "w"))
for folder, work in zip(sys.argv[1::2], sys.argv[2::2]):  # each export's own section
    fresh()
    print(f"=== {folder} ===", file=sys.stderr)
    load(folder, work)
"""


def _ok(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


#: Texts whose ids the two tokenizers must agree on.
TEXTS = 1000


def _held_out_texts(count: int = TEXTS) -> list[str]:
    """`count` texts the runs never trained on: every document of the stdlib files in the default
    split (100 of them: the embedded corpus's 5 % split holds no more), then their passages (the
    blocks between blank lines) in order, each a text of its own, without repeats: a text's start
    is where a tokenizer's handling (a leading space, an added token) shows."""
    root = stdlib_root()
    files = [
        f
        for f in stdlib_files(root)
        if is_held_out(f.relative_to(root).as_posix(), DEFAULT_FRACTION)
    ]
    parts = extract_stdlib_documents(files, root)
    docs = [d.decode("utf-8") for part in parts.values() for _, d in part]
    texts, seen = list(docs), set(docs)
    for passage in (p for d in docs for p in d.split("\n\n")):
        if len(texts) == count:
            break
        if passage.strip() and passage not in seen:
            texts.append(passage)
            seen.add(passage)
    return texts


@pytest.fixture(scope="module")
def held_out() -> list[str]:
    texts = _held_out_texts()
    assert len(texts) == TEXTS
    return texts


#: The Hub metadata the model card must carry (run.toml's [export]).
EXPORT_TOML = '\n[export]\nlicense = "apache-2.0"\nlanguage = ["en"]\n'
#: Everything the Hub folder holds, and nothing else.
HUB_FILES = {
    "README.md",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _train(run: Path, cache: Path, toml: str, subword: bool) -> Path:
    (run / "run.toml").write_text(f"[model]\nblock_size = {BLOCK}\n" + toml + EXPORT_TOML)
    if subword:
        # Into the session's cache: the run's first start then reads no document again.
        argv = ("--vocab-size", "400", "--cache-dir", str(cache))
        _ok(andreactl(run, "tokenizer", "train", *argv, timeout=600))
    res = run_trainer(run, cache, "--max-steps", "20", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def bytes_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A short andrea-tiny run (block_size 128) of the byte-level tokenizer."""
    return _train(tmp_path_factory.mktemp("run-bytes"), cache_dir, "", subword=False)


SUBWORD_TOML = """\
[data]
tokenizer = "tokenizer.json"

[[data.arms]]
name = "docstrings"
kind = "stdlib"
part = "docstrings"

[[data.arms]]
name = "comments"
kind = "stdlib"
part = "comments"
"""


def _readme_commands() -> list[str]:
    """README.md's three commands, from a trained run to pipeline("text-generation"), verbatim."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Taking the model away") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README.md lost its three commands"
    commands = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(commands) == 3
    return commands


def _run_as_written(command: str, where: Path) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(where / "hf"))
    res = subprocess.run(["bash", "-c", command], cwd=where, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    return _ok(res)


@pytest.fixture(scope="module")
def readme_folder(bytes_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as the README's commands expect it (.venv/, the bytes run as runs/demo), where its
    first command, the export, ran as written."""
    where = tmp_path_factory.mktemp("readme")
    (where / ".venv").symlink_to(REPO / ".venv")
    shutil.copytree(bytes_run, where / "runs" / "demo", ignore=shutil.ignore_patterns(".sock"))
    _run_as_written(_readme_commands()[0], where)
    return where


def _subword_export(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    run = _train(tmp_path_factory.mktemp("run-subword"), cache_dir, SUBWORD_TOML, True)
    dest = tmp_path_factory.mktemp("hf-subword") / "export"
    _ok(andreactl(run, "export", "--to", str(dest), "--format", "hf", timeout=600))
    return dest


#: The user's side of one export: the export folder, andrea's rows, logits and job, the loading
#: process's stderr as this export saw it (what came before the first export's section, then
#: this export's own section), and what it computed.
Loaded = tuple[Path, np.ndarray, np.ndarray, dict, str, dict]


@pytest.fixture(scope="module")
def loaded(
    readme_folder: Path,
    held_out: list[str],
    tmp_path_factory: pytest.TempPathFactory,
    cache_dir: Path,
) -> dict[str, Loaded]:
    """Each tokenizer kind's run, exported --format hf (the bytes run's by the README's command),
    loaded by transformers in one fresh process (LOADER, a section of its own per export, each
    with the warnings shown before forgotten): one start of torch and transformers serves both."""
    exports = {
        "bytes": readme_folder / "exports" / "demo-hf",
        "subword": _subword_export(tmp_path_factory, cache_dir),
    }
    jobs, argv = {}, []
    for kind, dest in exports.items():
        work = tmp_path_factory.mktemp(f"job-{kind}")
        rows, logits, job = _andrea_side(dest, held_out)
        report = json.loads((dest / "export.json").read_text())
        job["batch"] = _names_its_end_of_document(dest, report)
        np.save(work / "rows.npy", rows)
        (work / "job.json").write_text(json.dumps(job))
        jobs[kind] = (work, rows, logits, job)
        argv += [str(dest / "hf"), str(work)]
    elsewhere = tmp_path_factory.mktemp("cwd")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(elsewhere / "hf")}
    res = subprocess.run(
        [sys.executable, "-I", "-c", LOADER, *argv],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    _ok(res)
    preamble, *sections = re.split(r"^=== .* ===\n", res.stderr, flags=re.M)
    assert len(sections) == len(exports), res.stderr[-3000:]
    out = {}
    for (kind, dest), section in zip(exports.items(), sections, strict=True):
        work, rows, logits, job = jobs[kind]
        got = json.loads((work / "got.json").read_text())
        got["logits"] = np.load(work / "logits.npy")
        out[kind] = (dest, rows, logits, job, preamble + section, got)
    return out


def _andrea_side(dest: Path, held_out: list[str]) -> tuple[np.ndarray, np.ndarray, dict]:
    """Held-out rows, andrea's logits on them, and the job for the transformers side."""
    model, manifest = load_model(dest)
    tok = load_export_tokenizer(dest, manifest)
    stream = np.concatenate([np.asarray(tok.encode(d), dtype=np.int64) for d in held_out])
    rows = stream[: 8 * BLOCK].reshape(8, BLOCK)
    prompt = tok.encode(held_out[0])[:16]
    idx = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(torch.from_numpy(rows))[0].numpy()
        for _ in range(NEW_TOKENS):  # greedy: andrea's forward, its argmax each step
            nxt = model(idx[:, -BLOCK:])[0][:, -1, :].argmax(dim=-1, keepdim=True)
            idx = torch.cat([idx, nxt], dim=1)
    job = {
        "prompt": prompt,
        "new": NEW_TOKENS,
        "past": BLOCK,  # 16 + 128 positions: past the last
        "docs": held_out,
        "andrea_greedy": idx[0, len(prompt) :].tolist(),
        "andrea_ids": [tok.encode(d) for d in held_out],
    }
    return rows, logits, job


@pytest.mark.parametrize("kind", ["bytes", "subword"])
def test_transformers_loads_the_export_with_andreas_numbers(
    kind: str, loaded: dict[str, Loaded], held_out: list[str]
) -> None:
    exported, rows, logits, job, stderr, got = loaded[kind]
    hub = exported / "hf"
    assert {p.name for p in hub.iterdir()} == HUB_FILES, "the Hub folder holds only what it reads"
    card = (hub / "README.md").read_text()
    assert card.startswith('---\nlicense: "apache-2.0"\nlanguage: ["en"]\nlibrary_name:'), card
    assert "andrea_arms:" in card and '"dtype"' not in card  # stdlib arms: text, no dtype
    assert "## Training data mixture" in card and "IndexError: index out of range" in card
    assert not (exported / "README.md").read_text().startswith("---"), "the andrea README"
    assert {oct(p.stat().st_mode & 0o777) for p in hub.iterdir()} == {"0o644"}
    report = json.loads((exported / "export.json").read_text())
    assert any(c["name"] == "Hugging Face weights" for c in report["checks"])
    assert {f["name"] for f in report["files"]} >= {f"hf/{n}" for n in HUB_FILES}

    theirs = got["logits"]
    diff = float(np.abs(theirs[:, :, : logits.shape[-1]] - logits).max())
    n_ids = sum(len(i) for i in job["andrea_ids"])
    print(f"{exported}: max abs logit difference {diff:.3g} over {rows.size} positions; "
          f"{len(held_out)} held-out texts, {n_ids} ids compared")  # fmt: skip
    assert theirs.shape == logits.shape and diff <= 1e-5
    assert got["greedy"] == job["andrea_greedy"] and len(got["greedy"]) == NEW_TOKENS
    assert got["ids"] == job["andrea_ids"] and len(got["ids"]) == len(held_out)
    assert got["pipeline"].startswith("The ") and len(got["pipeline"]) > len("The ")
    # No warning at load, generate or pipeline (a max_length beside max_new_tokens warned at
    # every call); past the context, the documented IndexError after transformers' own warning.
    calls, past = stderr.split("--- past the context ---")
    assert "max_length" not in calls and "Warning" not in calls, calls[-3000:]
    assert got["default_new"] == BLOCK // 2 and len(job["prompt"]) + BLOCK // 2 <= BLOCK
    assert got["past"] == "IndexError: index out of range in self", got["past"]
    assert f"exceeded the model's predefined maximum length ({BLOCK})" in past
    if job["batch"]:
        first, second = got["batch"]
        assert first.startswith("The ") and second.startswith("def main(")


def _names_its_end_of_document(exported: Path, report: dict) -> bool:
    """A tokenizer that `tokenizer train` made has the end-of-document token (id 0): the
    export names it as eos and pad, where generation stops and with which batches are padded.
    A byte-level run has none (its documents are joined by a blank line)."""
    config, generation, tokenizer = (
        json.loads((exported / "hf" / name).read_text())
        for name in ("config.json", "generation_config.json", "tokenizer_config.json")
    )
    if report["tokenizer"]["kind"] == "bytes":
        assert config["eos_token_id"] is None and "pad_token" not in tokenizer
        return False
    assert config["eos_token_id"] == config["pad_token_id"] == 0
    assert generation["eos_token_id"] == generation["pad_token_id"] == 0
    assert tokenizer["eos_token"] == tokenizer["pad_token"] == "<|endofdocument|>"
    return True


def test_the_readmes_three_commands_run_as_written(readme_folder: Path) -> None:
    """README.md: from a trained run to pipeline("text-generation"), verbatim (the first
    command, the export, ran in the fixture; its folder is also the bytes run's export in `loaded`)."""
    assert (readme_folder / "exports" / "demo-hf" / "hf" / "config.json").is_file()
    outputs = [_run_as_written(command, readme_folder) for command in _readme_commands()[1:]]
    assert outputs[0].startswith("--- prompt 1 ---\ndef ") and len(outputs[0]) > 25
    # A 20-step model may well continue with spaces: the pipeline returned the prompt and more.
    assert outputs[1].startswith("def ") and len(outputs[1].rstrip("\n")) > len("def ")
