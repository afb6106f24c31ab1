"""The Hugging Face side of an export (``andreactl export --format hf``): the files with which
``transformers`` loads the checkpoint as a ``GPT2LMHeadModel``, with nothing of andrea installed.

The ANDREA GPT is GPT-2's architecture (pre-norm LayerNorm blocks, fused ``c_attn``, exact GELU,
learned positions, an untied head), so the mapping is direct:

- ``config.json``: a ``GPT2Config`` (``activation_function = "gelu"``, the exact GELU that
  ``F.gelu`` computes; ``tie_word_embeddings = false``; every dropout 0, as for inference);
- ``model.safetensors``: the weights under ``GPT2LMHeadModel``'s names, each ``nn.Linear`` weight
  transposed to GPT-2's ``Conv1D`` layout (in, out); where the run trained without biases, the
  biases GPT-2 always has are written as zeros (adding zero changes no bit);
- ``generation_config.json``: greedy, and a default of new tokens that keeps a short prompt
  inside the ``block_size`` positions (:func:`default_new_tokens`); no ``max_length``, which
  transformers would warn about at every call that sets ``max_new_tokens``;
- ``tokenizer.json`` + ``tokenizer_config.json``: the run's own tokenizer file, or, for a run of
  the byte-level tokenizer, a ``tokenizers`` file whose ids are the byte values (GPT-2's byte-level
  alphabet, each byte's symbol at the id of its value, no merges);
- a tokenizer with the end-of-document token (``andreactl tokenizer train`` reserves it, and it
  joined the run's documents) names it in all three configs as the eos token, where generation
  stops, and the pad token, which batches need (padded on the left, as a decoder-only model
  needs); its text inside a prompt stays text, as it was in the training documents;
- the model card (:mod:`andrea.control.export.card`).

All of them, and nothing else, go into the export's ``hf/`` folder (`HF_DIR`), the folder pushed to
the Hub; the checkpoint and what resumes it stay in the export folder above it. The files are
returned as bytes for the exporter to write with every other file's mode, and
:func:`check_weights` reads ``model.safetensors`` back against the checkpoint, bit for bit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from andrea.daemon.checkpoint import format as checkpoint_format
from andrea.daemon.checkpoint.manifest import Manifest
from andrea.daemon.config import ModelConfig
from andrea.daemon.data.tokenizer import END_OF_DOCUMENT

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
GENERATION_CONFIG_NAME = "generation_config.json"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"
#: The export's subfolder that holds the Hugging Face files and nothing else: the Hub's folder.
HF_DIR = "hf"
#: transformers' text-generation pipeline's default of new tokens, when the model names none.
PIPELINE_NEW_TOKENS = 256
#: nn.LayerNorm's default, which every norm of the ANDREA GPT uses.
LAYER_NORM_EPSILON = 1e-5
#: The Linear weights that GPT-2 stores as Conv1D, (in, out): andrea's are (out, in).
_CONV1D = re.compile(r"\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight$")


class HFExportError(ValueError):
    """The Hugging Face files do not hold the checkpoint's weights."""


def hf_config(model: ModelConfig) -> dict[str, Any]:
    """``config.json``: the ``GPT2Config`` of ``model``."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": model.vocab_size,
        "n_positions": model.block_size,
        "n_ctx": model.block_size,
        "n_embd": model.n_embd,
        "n_layer": model.n_layer,
        "n_head": model.n_head,
        "n_inner": 4 * model.n_embd,
        "activation_function": "gelu",
        "layer_norm_epsilon": LAYER_NORM_EPSILON,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": False,
        # GPT-2's own token 50256 is not in this vocabulary: no start token; an end token only
        # where the tokenizer has the end of a document (name_end_of_document).
        "bos_token_id": None,
        "eos_token_id": None,
        "use_cache": True,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
    }


def hf_name(name: str) -> str:
    """GPT2LMHeadModel's name of the andrea parameter ``name``."""
    if name == "lm_head.weight":
        return name
    if name.startswith("blocks."):
        return "transformer.h." + name[len("blocks.") :]
    return "transformer." + name


def _zero_biases(model: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The biases GPT-2 has and a run without biases lacks, by HF name and shape."""
    n = model.n_embd
    per_block = {
        "ln_1.bias": n,
        "attn.c_attn.bias": 3 * n,
        "attn.c_proj.bias": n,
        "ln_2.bias": n,
        "mlp.c_fc.bias": 4 * n,
        "mlp.c_proj.bias": n,
    }
    out: dict[str, tuple[int, ...]] = {
        f"transformer.h.{i}.{k}": (size,)
        for i in range(model.n_layer)
        for k, size in per_block.items()
    }
    out["transformer.ln_f.bias"] = (n,)
    return out


def hf_tensors(manifest: Manifest, weights: np.ndarray) -> dict[str, np.ndarray]:
    """The checkpoint's weights under GPT2LMHeadModel's names and layout, float32, contiguous."""
    tensors = checkpoint_format.unflatten(
        weights, [(e.name, tuple(e.shape), e.offset) for e in manifest.layout]
    )
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        out[hf_name(name)] = np.ascontiguousarray(t.T if _CONV1D.search(name) else t)
    for name, shape in _zero_biases(manifest.model).items():
        out.setdefault(name, np.zeros(shape, dtype=np.float32))
    return out


def weights_bytes(manifest: Manifest, weights: np.ndarray) -> bytes:
    """``model.safetensors``'s bytes."""
    from safetensors.numpy import save

    metadata = {"format": "pt", "step": str(manifest.step), "bin_sha256": manifest.bin_sha256}
    return save(hf_tensors(manifest, weights), metadata=metadata)


def check_weights(path: Path, manifest: Manifest, weights: np.ndarray) -> str:
    """Read ``model.safetensors`` back: every tensor equal, bit for bit, to the checkpoint's after
    the layout change, and the added biases zero. HFExportError names the first that is not."""
    from safetensors.numpy import load_file

    loaded = load_file(str(path))
    expected = hf_tensors(manifest, weights)
    if loaded.keys() != expected.keys():
        extra = sorted(loaded.keys() ^ expected.keys())
        raise HFExportError(f"{path}: other tensors than GPT2LMHeadModel's: {extra[:5]}")
    for name, t in expected.items():
        got = loaded[name]
        if got.dtype != np.float32 or got.shape != t.shape or got.tobytes() != t.tobytes():
            raise HFExportError(f"{path}: tensor {name} differs from the checkpoint's")
    added = len(expected) - len(manifest.layout)
    return (
        f"{len(manifest.layout)} tensors equal to the checkpoint's (Linear weights transposed to "
        f"Conv1D), bit for bit" + (f"; {added} zero biases" if added else "")
    )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable symbol (the ByteLevel pre-tokenizer's)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def byte_tokenizer_json() -> str:
    """A ``tokenizers`` file whose ids are the byte values: the byte-level tokenizer of a run."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {symbol: b for b, symbol in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: every byte is one symbol, whatever surrounds it.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True)


def tokenizer_config(model: ModelConfig) -> dict[str, Any]:
    """``tokenizer_config.json``: a fast tokenizer that adds nothing and cleans nothing up."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model.block_size,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }


def default_new_tokens(block_size: int) -> int:
    """The new tokens a call that names none generates: half the context, so that a prompt of up to
    the other half stays inside it, and at most transformers' pipeline's own default (256)."""
    return max(1, min(PIPELINE_NEW_TOKENS, block_size // 2))


def generation_config(model: ModelConfig) -> dict[str, Any]:
    """``generation_config.json``: greedy, and `default_new_tokens` when a call names no length.
    No ``max_length``: with it, every call that sets ``max_new_tokens`` (as the pipeline's usage
    does) warns that both are set."""
    return {
        "max_new_tokens": default_new_tokens(model.block_size),
        "do_sample": False,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def name_end_of_document(
    config: dict[str, Any], generation: dict[str, Any], tokenizer: dict[str, Any], token: int
) -> None:
    """Name the end-of-document token `token` (its id) as eos and pad in ``config.json``,
    ``generation_config.json`` and ``tokenizer_config.json``."""
    config.update(eos_token_id=token, pad_token_id=token)
    generation.update(eos_token_id=token, pad_token_id=token)
    tokenizer.update(
        eos_token=END_OF_DOCUMENT,
        pad_token=END_OF_DOCUMENT,
        padding_side="left",
        # As the run encoded its documents: the token's text in a text is text.
        split_special_tokens=True,
    )


def hf_files(
    manifest: Manifest,
    weights: np.ndarray,
    tokenizer: bytes | None,
    end_of_document: int | None = None,
) -> dict[str, bytes]:
    """Every Hugging Face file but the model card: name -> bytes. ``tokenizer``: a subword run's
    own ``tokenizer.json``; None for a byte-level run, which gets one whose ids are the bytes.
    `end_of_document`: the id of the tokenizer's end-of-document token, named as eos and pad
    (None: it has none)."""
    model = manifest.model

    def as_json(doc: dict[str, Any]) -> bytes:
        return (json.dumps(doc, indent=2) + "\n").encode()

    config, generation, tokenizer_settings = (
        hf_config(model),
        generation_config(model),
        tokenizer_config(model),
    )
    if end_of_document is not None:
        name_end_of_document(config, generation, tokenizer_settings, end_of_document)
    files = {
        CONFIG_NAME: as_json(config),
        GENERATION_CONFIG_NAME: as_json(generation),
        TOKENIZER_CONFIG_NAME: as_json(tokenizer_settings),
        WEIGHTS_NAME: weights_bytes(manifest, weights),
    }
    files["tokenizer.json"] = tokenizer if tokenizer is not None else byte_tokenizer_json().encode()
    return files


def check_byte_tokenizer(path: Path, text: str) -> str:
    """The byte tokenizer written at ``path`` encodes ``text`` to its UTF-8 bytes and back."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    ids = tok.encode(text, add_special_tokens=False).ids
    if ids != list(text.encode("utf-8")) or tok.decode(ids) != text:
        raise HFExportError(f"{path}: its ids are not the byte values of the text")
    return f"ids = byte values on {len(ids)} bytes, decoded back"
