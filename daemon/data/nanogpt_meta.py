"""nanoGPT's ``meta.pkl``, read without running anything: its vocabulary, as a tokenizer.

nanoGPT's character-level ``prepare.py`` writes ``meta.pkl`` beside ``train.bin`` and ``val.bin``:
``pickle.dump({'vocab_size': 65, 'itos': {0: '\\n', ...}, 'stoi': {'\\n': 0, ...}})``. A pickle
may run code when it is loaded (its ``__reduce__`` names any callable, ``os.system`` among them),
so it is read by an unpickler that refuses every global: no class, no function, nothing that
could run is ever looked up, and what it builds is checked to be plain data (dicts, lists,
tuples, strings, bytes, numbers). Anything else is refused naming the file (`MetaRefused`).

Its ``itos`` becomes a Hugging Face ``tokenizers`` file built here, byte for byte the same from
the same vocabulary (a WordLevel model of one character a token, split character by character
and decoded by joining; a character it lacks encodes as a space, `unknown_stand_in`): the run's
tokenizer when ``[data] tokenizer`` names the ``meta.pkl``.
Its identity is that file's sha256, so an export ships exactly that file as ``tokenizer.json``
and decodes what ``andreactl generate`` decodes.
"""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from andrea.daemon.rundir.boundedio import FileRejected, read_bounded

#: nanoGPT's name for it, beside the token files.
META_NAME = "meta.pkl"
#: The largest meta.pkl read: a character vocabulary is a few kB, GPT-2-sized maps a few MB.
MAX_META_BYTES = 64 << 20
#: Objects a meta.pkl may hold in all (shared ones counted once).
MAX_META_OBJECTS = 4_000_000
_PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class MetaRefused(ValueError):
    """A meta.pkl that is not nanoGPT's plain data, or cannot be read; the message names it."""


class _PlainOnly(pickle.Unpickler):
    """An unpickler that looks up no global: a pickle that names a class or a function (what
    any code a pickle runs needs) fails here, before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"it names {module}.{name}, and only plain data is read")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to an object outside the file")


def _check_plain(root: Any, path: Path) -> None:
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if not isinstance(obj, _PLAIN) or type(obj) not in _PLAIN:
            raise MetaRefused(
                f"{path}: holds a {type(obj).__name__}; only plain dicts, lists, strings and "
                "numbers are read from a meta.pkl"
            )
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if len(seen) > MAX_META_OBJECTS:
            raise MetaRefused(f"{path}: holds more than {MAX_META_OBJECTS:,} objects")
        if isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, list | tuple):
            todo.extend(obj)


def load_plain(path: Path) -> Any:
    """The plain data of the pickle at `path`, loaded without looking up any class or function.
    MetaRefused naming the file otherwise."""
    try:
        raw = read_bounded(path, MAX_META_BYTES, follow_symlinks=True)
    except FileNotFoundError:
        raise MetaRefused(f"{path} does not exist") from None
    except (FileRejected, OSError) as e:
        raise MetaRefused(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        data = _PlainOnly(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise MetaRefused(f"{path}: refused, nothing in it was run: {e}") from None
    except (
        EOFError,
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        RecursionError,
        MemoryError,
    ) as e:
        raise MetaRefused(f"{path}: not a readable pickle ({type(e).__name__}: {e})") from None
    _check_plain(data, path)
    return data


@dataclass(frozen=True)
class NanoMeta:
    """What nanoGPT's meta.pkl says: its vocabulary's size and each id's character."""

    path: Path
    vocab_size: int
    itos: dict[int, str]


def read_meta(path: Path) -> NanoMeta:
    """nanoGPT's meta.pkl at `path`. MetaRefused naming the file when it is not one."""
    data = load_plain(path)
    if not isinstance(data, dict):
        raise MetaRefused(f"{path}: holds a {type(data).__name__}, not nanoGPT's dict")
    size, itos = data.get("vocab_size"), data.get("itos")
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= 1 << 22:
        raise MetaRefused(f"{path}: 'vocab_size' is {size!r}, not a vocabulary's size")
    if not isinstance(itos, dict):
        raise MetaRefused(
            f"{path}: has no 'itos' (id to character) dict: only nanoGPT's character-level "
            "meta.pkl names its tokens"
        )
    chars: dict[int, str] = {}
    for i, c in itos.items():
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < size:
            raise MetaRefused(f"{path}: itos has the id {i!r}, outside 0..{size - 1}")
        if not isinstance(c, str) or len(c) != 1:
            raise MetaRefused(
                f"{path}: itos maps id {i} to {c!r}, not one character: only nanoGPT's "
                "character-level vocabularies are read"
            )
        chars[i] = c
    if len(set(chars.values())) != len(chars):
        raise MetaRefused(f"{path}: itos gives one character two ids")
    return NanoMeta(path, size, dict(sorted(chars.items())))


def unknown_stand_in(meta: NanoMeta) -> str:
    """What a character the vocabulary lacks encodes as: a space when it has one, else its first
    character. (nanoGPT's own encode fails on one; a tokenizer must encode any text: the export's
    check text, a prompt.)"""
    chars = list(meta.itos.values())
    return " " if " " in chars else chars[0]


def tokenizer_json(meta: NanoMeta) -> bytes:
    """The ``tokenizers`` file of `meta`'s vocabulary: the same bytes for the same vocabulary."""
    vocab = {c: i for i, c in meta.itos.items()}
    spec: dict[str, object] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": "[\\s\\S]"},
            "behavior": "Isolated",
            "invert": False,
        },
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unknown_stand_in(meta)},
    }
    return (json.dumps(spec, ensure_ascii=True, indent=1) + "\n").encode()


def is_meta(spec: str) -> bool:
    """Whether `[data] tokenizer = spec` names a nanoGPT meta.pkl (by its suffix)."""
    return spec.endswith(".pkl")
