"""The resume recipe of an export's README: the commands that make a new run directory from the
export folder, with every path of ``run.toml`` that is relative to the run directory provided.

A run resolves the relative paths of its ``run.toml`` against its own directory: ``[data]
tokenizer``, the paths of its arms (what each arm's kind names: the globs of its text, jsonl
and parquet arms, a tokens arm's file and held-out file), ``[metrics]
prometheus_textfile_dir``. They cannot be rewritten as absolute paths in the copy: the data
settings are part of the training config's hash, so a checkpoint would refuse to resume under
them. So ``run.toml`` is copied as it is, and the recipe puts in the new directory what each
relative path must find there: the export's ``tokenizer.json`` at the tokenizer's path, and a copy
of each arm's data, from where it lay when the export was made (its absolute path, written out).
An arm's data is identified by its files' paths relative to the arm's own directory and their
bytes, so the copy is the same data.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

from andrea.daemon.config import ConfigError, load_toml
from andrea.daemon.data.kinds import registry as kinds
from andrea.daemon.data.tokenizer import BYTES
from andrea.daemon.rundir.layout import CONFIG_FILE

#: The new run directory, as the recipe names it (a shell variable its first line sets).
DIR = '"$DIR"'
#: A glob the recipe may leave to the shell: plain path characters and the wildcards.
_SHELL_SAFE = re.compile(r"^[A-Za-z0-9._/*?-]+$")
_MAGIC = re.compile(r"[*?\[]")


def resume_recipe(run_dir: Path, stem: str, tokenizer_file: str | None) -> str:
    """The README's resume commands for the checkpoint ``stem`` of ``run_dir`` (Markdown), run in
    the export folder; ``tokenizer_file``: the export's copy of a subword run's tokenizer."""
    base = run_dir.resolve()
    try:
        values = load_toml(base / CONFIG_FILE, follow_symlinks=False)
    except ConfigError:
        values = None
    lines = [
        "DIR=../resumed-run                 # the new run directory (any path; relative: to here)",
        f'mkdir -p "$DIR" && cp {stem}.bin {stem}.json {CONFIG_FILE} "$DIR"/',
    ]
    notes: list[str] = []
    if values is None:
        notes.append(
            f"This export has no readable `{CONFIG_FILE}`: write one from the manifest's `config` "
            "(the resolved config of this step) before starting the trainer."
        )
        lines[1] = f'mkdir -p "$DIR" && cp {stem}.bin {stem}.json "$DIR"/'
    else:
        _tokenizer(values, tokenizer_file, lines, notes)
        for arm in _arms(values):
            _arm(arm, base, lines, notes)
        _metrics_dir(values, lines)
    lines.append('andrea-trainer --run-dir "$DIR"')
    text = "```sh\n" + "\n".join(lines) + "\n```\n"
    return text + "".join(f"\n{n}\n" for n in notes)


def _tokenizer(
    values: dict[str, Any], tokenizer_file: str | None, lines: list[str], notes: list[str]
) -> None:
    data = values.get("data") if isinstance(values.get("data"), dict) else {}
    spec = data.get("tokenizer", BYTES) if isinstance(data, dict) else BYTES
    if not isinstance(spec, str) or spec == BYTES or tokenizer_file is None:
        return
    where = PurePosixPath(spec)
    if where.is_absolute() or spec.startswith("~"):
        notes.append(
            f"`[data] tokenizer` is `{spec}`: the file there must be this folder's "
            f"`{tokenizer_file}` (the manifest checks its sha256)."
        )
        return
    lines.append(_copy_to(tokenizer_file, where, f"[data] tokenizer = {spec!r}"))


def _arms(values: dict[str, Any]) -> list[dict[str, Any]]:
    data = values.get("data")
    arms = data.get("arms") if isinstance(data, dict) else None
    return [a for a in arms if isinstance(a, dict)] if isinstance(arms, list) else []


def _arm(arm: dict[str, Any], base: Path, lines: list[str], notes: list[str]) -> None:
    name = arm.get("name", "?")
    kind = kinds.find(arm.get("kind"))
    for pattern in kind.export_paths(arm) if kind is not None else []:
        if PurePosixPath(pattern).is_absolute() or pattern.startswith("~"):
            notes.append(
                f"Arm `{name}` reads `{pattern}`, an absolute path: the same files must be there "
                "on the machine that resumes."
            )
        elif (line := _data_copy(pattern, base, f"arm {name!r}: {pattern!r}")) is not None:
            if line not in lines:
                lines.append(line)
        else:
            notes.append(
                f"Arm `{name}` reads `{pattern}` relative to the run directory: copy the files "
                f"it matches in `{base}` into `$DIR`, at the same paths relative to it."
            )


def _data_copy(pattern: str, base: Path, what: str) -> str | None:
    """The command that copies what ``pattern`` (relative to ``base``) matches under the new
    directory: its directory part before the first wildcard, whole; None when there is none that
    the shell can be left to expand."""
    parts = PurePosixPath(pattern).parts
    fixed = []
    for part in parts:
        if _MAGIC.search(part):
            break
        fixed.append(part)
    if len(fixed) == len(parts):  # a file, named
        return _copy_to(shlex.quote(str(base / pattern)), PurePosixPath(pattern), what)
    if fixed:
        folder = shlex.quote(str(PurePosixPath(*fixed)))
        source = shlex.quote(f"{base.joinpath(*fixed)}/.")
        return f"mkdir -p {DIR}/{folder} && cp -R {source} {DIR}/{folder}/   # {what}"
    if len(parts) == 1 and _SHELL_SAFE.match(pattern):
        return f"cp {shlex.quote(str(base))}/{pattern} {DIR}/   # {what}"
    return None


def _copy_to(source: str, where: PurePosixPath, what: str) -> str:
    target = f"{DIR}/{shlex.quote(str(where))}"
    if str(where.parent) != ".":
        return f"mkdir -p {DIR}/{shlex.quote(str(where.parent))} && cp {source} {target}   # {what}"
    return f"cp {source} {target}   # {what}"


def _metrics_dir(values: dict[str, Any], lines: list[str]) -> None:
    metrics = values.get("metrics")
    folder = metrics.get("prometheus_textfile_dir") if isinstance(metrics, dict) else None
    if isinstance(folder, str) and not PurePosixPath(folder).is_absolute():
        lines.append(
            f"mkdir -p {DIR}/{shlex.quote(folder)}   # [metrics] prometheus_textfile_dir = {folder!r}"
        )
