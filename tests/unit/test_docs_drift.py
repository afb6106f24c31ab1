"""Docs the code keeps true: what docs/ and README.md name exists in the code.

Each rule reads the Markdown and asks the code itself, never a copy of it:

- module paths (`daemon/trainer/loop.py`, `mixing/run_state.py`, `tests/unit/test_x.py::test_y`) and dotted
  names (`andrea.daemon.checkpoint.manifest.Manifest`, `from andrea.x import a, b`) exist;
- every `--flag` is an option of the command it is written after (the real parsers of
  andrea-trainer, andrea-proxy and andreactl with each command, torchrun's own parser; the
  `add_argument` calls of the other entry points and scripts); a flag written without its command
  is an option of one of them;
- a list of reasons written as such (stop reasons (`sigterm`, ...), checkpoint reasons (...),
  triggers (...)) is the whole of `process.StopReason`, `CheckpointReason` or the manifest's
  `Trigger`; a single trigger (`trigger: sigterm`, trigger `boundary`) is one of them;
- the manifest table of checkpoint-format.md is the pydantic `Manifest`: each field a row, each
  nested model's fields named in its row (the tables of `.loss.json`'s and `.state.json`'s fields
  are their models too);
- dotted settings and manifest paths (`checkpoint.every`, `environment.world_size`) resolve in
  `RunConfig` or `Manifest`;
- links between the docs point at a file and heading that exist;
- every module of daemon/, control/ and protocol/ is named on docs/architecture.md;
- the docstrings of those packages name modules, dotted names and functions (`name()`) that
  exist: a file name in the docstring's own top-level package, a function among the packages'
  definitions, Python's builtins, the docstring's parameters and its module's imports (a name
  after a possessive, nanoGPT's `prepare.py`, is another project's).

Each rule is a function from a document's text to the problems found, so that the tests at the end
inject one drift of each kind into a real document and see it reported.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import os
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.run as torchrun
from pydantic import BaseModel

from andrea.control import andreactl
from andrea.daemon.checkpoint.manifest import Manifest, Trigger
from andrea.daemon.config import RunConfig
from andrea.daemon.mixing import cli as proxy_cli
from andrea.daemon.mixing.proxyfiles import ProxyState
from andrea.daemon.runtime.operator_requests import CheckpointReason, StopReason
from andrea.daemon.trainer.service import cli as trainer_cli
from andrea.protocol.lossentry import LossEntry

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("daemon", "control", "protocol")
#: Top-level folders of the repository: a path that starts with one names a file of the repository.
REPO_DIRS = (*PACKAGES, "tests", "scripts", "units", "docs")

# ---- the documents -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    name: str
    text: str


def documents() -> list[Doc]:
    paths = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    return [Doc(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")) for p in paths]


@dataclass(frozen=True)
class Context:
    """A piece of a document read as one command line (a code line or an inline code span), or
    as prose (`command=False`): where a flag is looked up depends on it."""

    line: int
    text: str
    command: bool


FENCE = re.compile(r"^\s*(```|~~~)(\w*)")
#: Code blocks whose lines are shell command lines; other languages are read as prose.
SHELL = {"", "sh", "bash", "shell", "console"}
SPAN = re.compile(r"`([^`\n]+)`")


def contexts(text: str) -> Iterator[Context]:
    """Shell code lines (continuations joined) and inline code spans as commands; prose around the
    spans, and code in other languages, as prose."""
    fence: str | None = None
    lang = ""
    pending: Context | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if m := FENCE.match(line):
            if fence is None:
                fence, lang = m.group(1), m.group(2)
            elif m.group(1) == fence:
                fence = None
            if pending is not None:
                yield pending
                pending = None
            continue
        if fence is not None and lang in SHELL:
            # A line that goes on with options (`   [--max-steps N]`) or after a backslash
            # continues the command above it.
            if pending is not None and (pending.text.endswith("\\") or re.match(r"\s+[\[-]", line)):
                pending = Context(pending.line, pending.text.rstrip("\\") + " " + line, True)
                continue
            if pending is not None:
                yield pending
            pending = Context(number, line, True)
            continue
        if fence is not None:
            yield Context(number, line, False)
            continue
        for span in SPAN.finditer(line):
            yield Context(number, span.group(1), True)
        yield Context(number, SPAN.sub(" ", line), False)
    if pending is not None:
        yield pending


def headings(text: str) -> list[tuple[int, str]]:
    """(line number, heading text) of every Markdown heading outside code blocks."""
    found, fence = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6}\s+(.*)", line)):
            found.append((number, m.group(1).strip()))
    return found


# ---- module paths and dotted names -------------------------------------------------------------


@cache
def repo_files() -> frozenset[str]:
    """The files under the repository's top-level folders, as paths from its root."""
    return frozenset(
        str(p.relative_to(ROOT))
        for top in REPO_DIRS
        for p in (ROOT / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


@cache
def repo_dirs() -> frozenset[str]:
    return frozenset(str(Path(f).parent) for f in repo_files())


@cache
def modules() -> tuple[str, ...]:
    """Every module of the product's packages, as a path from the repository root."""
    return tuple(
        sorted(f for f in repo_files() if f.endswith(".py") and f.split("/")[0] in PACKAGES)
    )


PATH = re.compile(
    r"(?<![\w./@~$-])((?:[\w.-]+/)*[\w-]+\.py|(?:" + "|".join(REPO_DIRS) + r")/[\w./@-]*)"
)


def named_paths(text: str) -> Iterator[tuple[int, str]]:
    """Repository paths a document names: any `x.py` (bare or with folders), and any path under a
    top-level folder of the repository (`units/andrea@.target`, `tests/unit/test_x.py::test_y`)."""
    for number, line in enumerate(text.splitlines(), 1):
        for m in PATH.finditer(line):
            if "://" in line[max(0, m.start() - 40) : m.start()]:
                continue  # a URL, not ours
            yield number, m.group(1).rstrip(".")


def path_problems(doc: Doc) -> list[str]:
    problems = []
    files, dirs = repo_files(), repo_dirs()
    for number, path in named_paths(doc.text):
        if path.split("/")[0] in REPO_DIRS:
            exists = path in files or path.rstrip("/") in dirs
        else:  # relative to some folder: `mixing/run_state.py`, `rundir.py`
            exists = any(f == path or f.endswith("/" + path) for f in files)
        if not exists:
            problems.append(f"{doc.name}:{number}: {path} does not exist")
    for number, line in enumerate(doc.text.splitlines(), 1):
        for node in re.findall(r"\b(tests/[\w/]+\.py)::(\w+)", line):
            path, name = node
            if path in files and f"def {name}(" not in (ROOT / path).read_text(encoding="utf-8"):
                problems.append(f"{doc.name}:{number}: {path} has no test {name}")
    return problems


DOTTED = re.compile(r"\bandrea\.(?:" + "|".join(PACKAGES) + r")(?:\.\w+)*")
FROM_IMPORT = re.compile(r"\bfrom (andrea(?:\.\w+)+) import ([\w, ]+)")


def resolves(dotted: str) -> bool:
    """Whether `andrea.a.b.C.d` (or `random.getstate`, any package's) is a module, or an attribute
    of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def dotted_problems(doc: Doc) -> list[str]:
    problems = []
    for number, line in enumerate(doc.text.splitlines(), 1):
        names = set(DOTTED.findall(line))
        for module, imported in FROM_IMPORT.findall(line):
            names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
        problems += [
            f"{doc.name}:{number}: {n} is neither a module nor an attribute of one"
            for n in sorted(names)
            if not resolves(n)
        ]
    return problems


# ---- command-line flags ------------------------------------------------------------------------


def parser_options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def declared_options(*paths: str) -> set[str]:
    """The `--options` of the `add_argument` calls in these files: the entry points that build
    their parser inside `main` (scripts, benchmarks, `python -m` tools); and of the `addoption`
    calls of a conftest, pytest's options of the suite."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse((ROOT / path).read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add_argument", "addoption")
            ):
                found |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                }
    return found | {"--help"}


def shell_options(path: str) -> set[str]:
    """The options a shell script's `case` parses (`--user)`, `-h|--help)`)."""
    text = (ROOT / path).read_text(encoding="utf-8")
    return set(re.findall(r"(--[a-z][\w-]*)(?=[|)])", text))


#: Other programs' options that the docs use, for commands whose parser this test cannot read.
EXTERNAL: dict[str, set[str]] = {
    "systemctl": {"--now", "--kill-whom"},  # enable --now; kill --kill-whom=main
    "tensorboard": {"--logdir"},
    "ruff": {"--check"},  # ruff format --check
    # The install beside a GPU machine's own torch (scripts/gpu_check.py), and the wheelhouse's
    # offline resolution (scripts/wheelhouse_check.py).
    "pip": {"--no-index", "--no-deps", "--no-build-isolation", "--target", "--dry-run"}
    | {"--python-version", "--only-binary"},
    "python3": {"--system-site-packages"},  # python3 -m venv --system-site-packages
}


@dataclass(frozen=True)
class Program:
    """A command the docs write flags after: how it is spelled, and the options it takes."""

    name: str
    pattern: re.Pattern[str]
    options: set[str]
    #: For andreactl: each command's own options (its global options are in `options`).
    commands: dict[str, set[str]]


def _program(
    name: str, spelling: str, options: set[str], commands: dict[str, set[str]] | None = None
) -> Program:
    return Program(name, re.compile(spelling), options, commands or {})


@cache
def programs() -> tuple[Program, ...]:
    return (*_product_programs(), *_other_programs())


def _product_programs() -> list[Program]:
    """The daemons and andreactl (their real parsers), and the `python -m` tools."""
    ctl = andreactl.build_parser()
    commands = {name: parser_options(sub) for name, sub in subparsers(ctl).items()}
    return [
        _program(
            "andrea-trainer",
            r"andrea-trainer(?![\w@-])|andrea\.daemon\.trainer\.service\.cli\b|ANDREA_TRAINER_ARGS=",
            parser_options(trainer_cli.build_parser()),
        ),
        _program(
            "andrea-proxy",
            r"andrea-proxy(?![\w@-])|andrea\.daemon\.mixing\.cli\b|ANDREA_PROXY_ARGS=",
            parser_options(proxy_cli.build_parser()),
        ),
        # ctl: docs/operations.md's shell function for `sudo -u andrea andreactl --run-dir RUN`.
        _program(
            "andreactl",
            r"(?<![\w-])andreactl(?![\w@-])|(?<![\w-])ctl(?![\w-])",
            parser_options(ctl),
            commands,
        ),
        _program(
            "python -m andrea.control.export",
            r"andrea\.control\.export\b",
            declared_options("control/export/bundle.py"),
        ),
        _program(
            "python -m andrea.control.verify_resume",
            r"andrea\.control\.verify_resume\b",
            declared_options("control/verify_resume/__init__.py", "control/verify_options.py"),
        ),
        _program(
            "python -m andrea.control.mini_problem",
            r"andrea\.control\.mini_problem\b",
            declared_options("control/mini_problem/cli.py"),
        ),
    ]


def _other_programs() -> list[Program]:
    """Scripts, benchmarks, torchrun (its real parser) and the few other programs of EXTERNAL."""
    scripts = [
        *sorted((ROOT / "scripts").glob("*.py")),
        *sorted((ROOT / "tests" / "bench").glob("*.py")),
        # also run as `python -m tests.support.audited_run`
        ROOT / "tests" / "support" / "audited_run.py",
    ]
    tools = [
        _program(p.name, rf"\b{p.stem}(?:\.py)?\b", declared_options(str(p.relative_to(ROOT))))
        for p in scripts
    ]
    tools += [
        _program(p.name, rf"\b{re.escape(p.name)}\b", shell_options(str(p.relative_to(ROOT))))
        for p in sorted((ROOT / "scripts").glob("*.sh"))
    ]
    tools.append(
        _program("torchrun", r"\btorchrun(?![\w-])", parser_options(torchrun.get_args_parser()))
    )
    # The suite's own options (tests/conftest.py), beside pytest's that the docs use.
    pytest_options = declared_options("tests/conftest.py") | {"--durations", "--dist"}
    tools.append(_program("pytest", r"\bpytest(?![\w-])", pytest_options))
    # Another program's name is often a value (`--format tensorboard`): only at the start of a
    # command is it the command.
    tools += [
        _program(n, rf"^\s*(?:sudo\s+)?(?:\S*/)?{n}(?![\w-])", o) for n, o in EXTERNAL.items()
    ]
    return tools


@cache
def every_option() -> frozenset[str]:
    found: set[str] = set()
    for p in programs():
        found |= p.options
        for opts in p.commands.values():
            found |= opts
    return frozenset(found)


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
#: Where one command ends and another begins on a shell line.
SEPARATOR = re.compile(r"\s\|\s|;|&&|\|\||\s&\s|\$\(|(?:^|\s)#")


def _owner(segment: str, at: int) -> tuple[Program, str | None] | None:
    """The program whose name comes last before position `at`, and for andreactl its command."""
    best: tuple[int, Program, int] | None = None
    for program in programs():
        for m in program.pattern.finditer(segment, 0, at):
            if best is None or m.start() > best[0]:
                best = (m.start(), program, m.end())
    if best is None:
        return None
    _, program, end = best
    command = next((w for w in segment[end:at].split() if w in program.commands), None)
    return program, command


def flag_problems(doc: Doc) -> list[str]:
    problems = []
    for ctx in contexts(doc.text):
        segments = SEPARATOR.split(ctx.text) if ctx.command else [ctx.text]
        for segment in segments:
            for m in FLAG.finditer(segment):
                flag = m.group(0)
                owner = _owner(segment, m.start()) if ctx.command else None
                if owner is None:
                    if flag not in every_option():
                        problems.append(f"{doc.name}:{ctx.line}: {flag} is no command's option")
                    continue
                program, command = owner
                allowed = program.options | (
                    program.commands.get(command, set())
                    if command
                    else set().union(*program.commands.values())
                )
                if flag not in allowed:
                    where = f"{program.name} {command}" if command else program.name
                    problems.append(f"{doc.name}:{ctx.line}: {flag} is not an option of {where}")
    return problems


# ---- stop reasons, checkpoint reasons, triggers ------------------------------------------------

STOP_REASONS = set(typing.get_args(StopReason))
CHECKPOINT_REASONS = set(typing.get_args(CheckpointReason))
TRIGGERS = set(typing.get_args(Trigger))
#: "stop reasons (`a`, `b`)": a list of a vocabulary, which must be the whole of it.
LISTS = {
    "stop reason": STOP_REASONS,
    "checkpoint reason": CHECKPOINT_REASONS,
    "trigger": TRIGGERS,
}
LISTED = re.compile(
    r"\b(stop\s+reason|checkpoint\s+reason|trigger)s?\s*"
    r"\(((?:`[\w-]+`[,\s]*(?:or\s+|and\s+)?){2,})\)"
)
#: A single trigger named as one: `trigger: sigterm`, trigger `boundary`.
ONE_TRIGGER = re.compile(r"\btrigger(?::\s*|\s+`)([a-z][\w-]*)")


def reason_problems(doc: Doc) -> list[str]:
    problems = []
    for m in LISTED.finditer(doc.text):
        kind = " ".join(m.group(1).split())
        names = set(re.findall(r"`([\w-]+)`", m.group(2)))
        if names != LISTS[kind]:
            number = doc.text[: m.start()].count("\n") + 1
            problems.append(
                f"{doc.name}:{number}: {kind}s listed as {sorted(names)}, "
                f"the code has {sorted(LISTS[kind])}"
            )
    for number, line in enumerate(doc.text.splitlines(), 1):
        problems += [
            f"{doc.name}:{number}: {name} is not a checkpoint trigger"
            for name in ONE_TRIGGER.findall(line)
            if name not in TRIGGERS
        ]
    return problems


def listed_vocabularies(docs: list[Doc]) -> set[str]:
    return {" ".join(m.group(1).split()) for d in docs for m in LISTED.finditer(d.text)}


# ---- the manifest, settings and manifest paths -------------------------------------------------


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (`X | None`, `list[X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def _literals(annotation: object) -> set[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return {a for a in typing.get_args(annotation) if isinstance(a, str)}
    return set()


def _table_rows(text: str, after_heading: str) -> list[tuple[int, list[str]]]:
    """The rows (line, cells) of the first table under the heading that starts with this text."""
    lines = text.splitlines()
    start = next(n for n, h in headings(text) if h.startswith(after_heading))
    rows: list[tuple[int, list[str]]] = []
    for number in range(start + 1, len(lines) + 1):
        line = lines[number - 1]
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not set(cells[0]) <= set("-: "):
                rows.append((number, cells))
        elif rows:
            break
    return rows[1:]  # the header


def _identifiers_in_spans(text: str) -> set[str]:
    return {w for span in SPAN.findall(text) for w in re.findall(r"[A-Za-z_][\w-]*", span)}


#: Records the manifest carries whose fields other pages describe (satellite-files.md,
#: evaluation.md): their rows need not repeat them.
DESCRIBED_ELSEWHERE = {"LossEntry", "EvalEntry"}


def model_table_problems(
    doc: Doc, heading: str, model: type[BaseModel], nested: bool = True
) -> list[str]:
    """The first table under `heading` is `model`: one row per field (the first column names it),
    and with `nested` each nested model's fields named in its row (except a model that has a row
    of its own), and the values of a Literal field (`trigger`) listed exactly."""
    rows = _table_rows(doc.text, heading)
    fields = model.model_fields
    own_row = {m for f in fields.values() for m in _models_in(f.annotation)}
    named: set[str] = set()
    problems = []
    for number, (first, *rest) in rows:
        names = set(SPAN.findall(first))
        named |= names
        problems += [
            f"{doc.name}:{number}: {model.__name__} has no field {n}" for n in names - set(fields)
        ]
        body = " ".join(rest)
        for name in sorted(names & set(fields)) if nested else []:
            problems += _row_problems(
                doc.name, number, fields[name].annotation, name, body, own_row
            )
    missing = set(fields) - named
    problems += [f"{doc.name}: the table lacks {model.__name__}.{f}" for f in sorted(missing)]
    return problems


def _row_problems(
    doc: str, number: int, annotation: object, name: str, body: str, own_row: set[type[BaseModel]]
) -> list[str]:
    if values := _literals(annotation):
        # The row may quote other things (a flag, a command); a lone word is a value.
        listed = {w for w in SPAN.findall(body) if re.fullmatch(r"[a-z][a-z0-9-]*", w)}
        if listed != values:
            return [f"{doc}:{number}: {name} lists {sorted(listed)}, the code has {sorted(values)}"]
        return []
    expected: set[str] = set()
    todo = [m for m in _models_in(annotation) if m.__name__ not in DESCRIBED_ELSEWHERE]
    seen: set[type[BaseModel]] = set()
    while todo:
        model = todo.pop()
        seen.add(model)
        for sub, info in model.model_fields.items():
            expected.add(sub)
            todo += [m for m in _models_in(info.annotation) if m not in own_row | seen]
    lacking = expected - _identifiers_in_spans(body)
    return [f"{doc}:{number}: the {name} row does not name {sorted(lacking)}"] if lacking else []


SETTING = re.compile(r"^([a-z_]+)((?:\.[a-z_]+)+)$")
FILE_NAME = re.compile(r"\.(py|json|toml|md|sh|bin|png|svg|txt|pt|safetensors)$")


def _resolves_in(model: type[BaseModel], parts: list[str]) -> bool:
    for i, part in enumerate(parts):
        if part not in model.model_fields:
            return False
        inner = _models_in(model.model_fields[part].annotation)
        if i + 1 < len(parts):
            if not inner:
                return False
            model = inner[0]
    return True


def setting_problems(doc: Doc) -> list[str]:
    """`checkpoint.every`, `environment.world_size`: a dotted path whose head is a setting of
    `RunConfig` or a field of `Manifest` must resolve in one of them (or name a module)."""
    problems = []
    for number, line in enumerate(doc.text.splitlines(), 1):
        for span in SPAN.findall(line):
            m = SETTING.match(span)
            if (
                not m
                or FILE_NAME.search(span)
                or not (m.group(1) in RunConfig.model_fields or m.group(1) in Manifest.model_fields)
            ):
                continue
            parts = span.split(".")
            if not (
                _resolves_in(RunConfig, parts)
                or _resolves_in(Manifest, parts)
                or resolves(f"andrea.daemon.{span}")
            ):
                problems.append(
                    f"{doc.name}:{number}: {span} is neither a setting nor a manifest field"
                )
    return problems


# ---- links between the docs --------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    for _, heading in headings(text):
        base, n = slug(heading), 0
        while (a := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(a)
    return found


LINK = re.compile(r"\]\(([^)\s]*?\.md|)(#[^)\s]+)?\)")


def link_problems(doc: Doc, texts: dict[str, str]) -> list[str]:
    """Every [link](page.md#heading) between the docs points at a page and heading that exist."""
    problems = []
    here = str(Path(doc.name).parent)
    for number, line in enumerate(doc.text.splitlines(), 1):
        for target, anchor in LINK.findall(line):
            page = os.path.normpath(os.path.join(here, target)) if target else doc.name
            if page not in texts:
                problems.append(f"{doc.name}:{number}: the link to {target} finds no page")
            elif anchor and anchor[1:] not in anchors(texts[page]):
                problems.append(f"{doc.name}:{number}: {target}{anchor} is no heading there")
    return problems


# ---- the architecture page ---------------------------------------------------------------------


def architecture_problems(doc: Doc) -> list[str]:
    """Every module of the packages is named on the page, and named where it is.

    A path from the repository root names its module. A file name (`loop.py`, `commands/pivot.py`)
    is read in the folder of the last such path before it on its line, else of the heading above
    it: `daemon/mixing/`: `run_state.py` is daemon/mixing/run_state.py. A package's `__init__` and
    `__main__` are named by the package's folder (`daemon/trainer/`, `verify_resume/`)."""
    named: set[str] = set()
    problems = []
    heads = headings(doc.text)
    for number, line in enumerate(doc.text.splitlines(), 1):
        heading = next((h for n, h in reversed(heads) if n < number), "")
        folder = ([""] + [_folder(p) for p in _paths_in(heading) if _folder(p)])[-1]
        for path in _paths_in(line):
            if _folder(path):
                folder = _folder(path)
            if not path.endswith(".py") or path.split("/")[0] in set(REPO_DIRS) - set(PACKAGES):
                continue  # a folder, or a test or script (the path rule checks those)
            module = _read_in(folder, path)
            if module is not None:
                named.add(module)
            elif folder:
                problems.append(f"{doc.name}:{number}: {path} is no module of {folder}")
            else:
                problems.append(f"{doc.name}:{number}: {path} names no one module: give its folder")
    folders = {p for p in _paths_in(doc.text) if p.endswith("/")}
    for m in modules():
        package = str(Path(m).parent) + "/"
        if Path(m).stem in ("__init__", "__main__") and any(
            package == f or package.endswith("/" + f) for f in folders
        ):
            named.add(m)
    problems += [f"{doc.name}: {m} is not on the page" for m in modules() if m not in named]
    return problems


def _paths_in(text: str) -> list[str]:
    return [m.group(1).rstrip(".") for m in PATH.finditer(text)]


def _folder(path: str) -> str:
    """The folder a path from the repository root sets for the file names after it; '' for a
    file name."""
    if path.split("/")[0] not in PACKAGES:
        return ""
    return path if path.endswith("/") else str(Path(path).parent) + "/"


def _read_in(folder: str, path: str) -> str | None:
    """The module `path` names, read in `folder` (without one: the only module of that name)."""
    if path.split("/")[0] in PACKAGES:
        return path if path in modules() else None
    if folder:
        return folder + path if folder + path in modules() else None
    candidates = [m for m in modules() if m.endswith("/" + path)]
    return candidates[0] if len(candidates) == 1 else None


# ---- docstrings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Docstring:
    """A docstring of the packages: where it starts, its text, and the names it may call that are
    not defined in the packages (its function's parameters, what its module imports)."""

    module: str
    line: int
    text: str
    names: frozenset[str] = frozenset()


def docstrings() -> list[Docstring]:
    """Every module, class and function docstring of daemon/, control/ and protocol/."""
    found = []
    for module in modules():
        tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
        imported = {
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        for node in ast.walk(tree):
            if not isinstance(
                node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
            ):
                continue
            text = ast.get_docstring(node, clean=False)
            if text is None:
                continue
            names = set(imported)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
            found.append(Docstring(module, node.body[0].lineno, text, frozenset(names)))
    return found


#: Written after a possessive, a name is another project's: nanoGPT's `prepare.py`, JavaScript's
#: `Number()`, nanoGPT's character-level `prepare.py` (two words may stand between).
FOREIGN = re.compile(r"'s\s+(?:[\w-]+\s+){0,2}`*$|'s\s*`*$")
CALL = re.compile(r"`+([A-Za-z_][\w.]*)\(")


@cache
def defined_names() -> frozenset[str]:
    """The names of every function and class the packages define."""
    names = set()
    for module in modules():
        for node in ast.walk(ast.parse((ROOT / module).read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
    return frozenset(names)


def _a_module_near(module: str, path: str) -> bool:
    """Whether the file a docstring of `module` names is a module of its own top-level package:
    a path from the repository root, or one that ends a module's path there."""
    if path.split("/")[0] in REPO_DIRS:
        return path in repo_files() or path.rstrip("/") in repo_dirs()
    package = module.split("/")[0] + "/"
    return any(m.startswith(package) and (m.endswith("/" + path)) for m in modules())


def _a_known_call(name: str, names: frozenset[str]) -> bool:
    """Whether `name()` is the project's, Python's, a parameter or an import of the docstring's,
    or an attribute of what the code works with (a module, a tensor, an array, a path)."""
    last = name.rsplit(".", 1)[-1]
    if last in defined_names() or last in names or hasattr(builtins, last):
        return True
    if "." in name and resolves(name):
        return True
    return any(hasattr(t, last) for t in (torch.nn.Module, torch.Tensor, np.ndarray, Path))


def docstring_problems(doc: Docstring) -> list[str]:
    """The modules, dotted names and functions a docstring names exist: a file name is read in the
    docstring's own top-level package (`loop.py` in daemon/ names a module of daemon/)."""
    problems = []
    for number, line in enumerate(doc.text.splitlines()):
        where = f"{doc.module}:{doc.line + number}"
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".")
            if not FOREIGN.search(line[: m.start()]) and not _a_module_near(doc.module, path):
                problems.append(f"{where}: {path} does not exist")
        problems += [
            f"{where}: {n} is neither a module nor an attribute of one"
            for n in sorted(set(DOTTED.findall(line)))
            if not resolves(n)
        ]
        for m in CALL.finditer(line):
            if not FOREIGN.search(line[: m.start()]) and not _a_known_call(m.group(1), doc.names):
                problems.append(f"{where}: {m.group(1)}() is defined nowhere")
    return problems


def test_what_the_docstrings_name_exists() -> None:
    assert [p for d in docstrings() for p in docstring_problems(d)] == []


def test_a_docstring_that_names_a_module_or_function_gone_is_found() -> None:
    (loop,) = [d for d in docstrings() if d.module == "daemon/trainer/loop.py" and d.line == 1]
    stale = Docstring(loop.module, 1, loop.text.replace("phase_follower.py", "pivot.py", 1))
    (number,) = [n for n, line in enumerate(stale.text.splitlines(), 1) if "- pivot.py" in line]
    assert docstring_problems(stale) == [
        f"daemon/trainer/loop.py:{number}: pivot.py does not exist"
    ]
    called = Docstring("daemon/model.py", 5, "Built by `build_gpt()`, unlike `build_model()`.")
    assert docstring_problems(called) == ["daemon/model.py:5: build_gpt() is defined nowhere"]
    foreign = Docstring(
        "control/x.py", 1, "As nanoGPT's `prepare.py` writes, JavaScript's `Number()`."
    )
    assert docstring_problems(foreign) == []


# ---- the rules, on every document --------------------------------------------------------------

DOCS = documents()
RULES = (path_problems, dotted_problems, flag_problems, reason_problems, setting_problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_what_the_docs_name_exists_in_the_code(doc: Doc) -> None:
    texts = {d.name: d.text for d in DOCS}
    problems = [p for rule in RULES for p in rule(doc)] + link_problems(doc, texts)
    assert problems == []


def page(name: str) -> Doc:
    (doc,) = [d for d in DOCS if d.name == name]
    return doc


def test_the_manifest_table_is_the_manifest_model() -> None:
    assert model_table_problems(page("docs/checkpoint-format.md"), "The manifest", Manifest) == []


def test_the_tables_of_the_satellite_files_are_their_models() -> None:
    doc = page("docs/satellite-files.md")
    assert model_table_problems(doc, "Schema", LossEntry, nested=False) == []
    assert model_table_problems(doc, ".state.json", ProxyState, nested=False) == []


def test_every_module_is_on_the_architecture_page() -> None:
    assert architecture_problems(page("docs/architecture.md")) == []


def tree_problems(doc: Doc) -> list[str]:
    """The code block under `## The tree` lists every module of the packages, and nothing else."""
    after = doc.text.split("\n## The tree\n", 1)[1]
    listed = after.split("```text\n", 1)[1].split("```", 1)[0].split()
    found = sorted(
        str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*.py")
    )
    problems = [f"{doc.name}: {m} is not in the tree" for m in found if m not in listed]
    problems += [f"{doc.name}: the tree lists {m}, no module" for m in listed if m not in found]
    if not problems and listed != found:
        problems.append(f"{doc.name}: the tree is not in `sort` order")
    return problems


def test_the_tree_on_the_architecture_page_is_the_folders() -> None:
    assert tree_problems(page("docs/architecture.md")) == []


def test_a_module_missing_from_the_tree_or_one_it_invents_is_found() -> None:
    name = "docs/architecture.md"
    doc, _ = drifted(name, "daemon/model.py\n", "")
    assert tree_problems(doc) == [f"{name}: daemon/model.py is not in the tree"]
    doc, _ = drifted(name, "daemon/model.py\n", "daemon/model.py\ndaemon/trainer_loop.py\n")
    assert tree_problems(doc) == [f"{name}: the tree lists daemon/trainer_loop.py, no module"]


def test_the_lists_of_reasons_are_checked_somewhere() -> None:
    """The stop and checkpoint reasons are listed in the docs, so their rule never idles."""
    assert listed_vocabularies(DOCS) >= {"stop reason", "checkpoint reason"}


# ---- the rules find what they are for: one drift of each kind, injected into a real page -------


def drifted(name: str, old: str, new: str) -> tuple[Doc, int]:
    """The document `name` with its first `old` replaced by `new`, and the line of the change."""
    doc = page(name)
    assert old in doc.text, f"{name} no longer holds {old!r}: pick another drift"
    line = doc.text[: doc.text.index(old)].count("\n") + 1
    return Doc(name, doc.text.replace(old, new, 1)), line


def test_a_module_path_that_does_not_exist_is_found() -> None:
    doc, n = drifted("README.md", "`daemon/config.py`", "`daemon/configuration.py`")
    assert path_problems(doc) == [f"README.md:{n}: daemon/configuration.py does not exist"]
    doc, n = drifted(
        "docs/distributed.md", "`daemon/trainer/platform/distributed.py`", "`daemon/distribute.py`"
    )
    assert path_problems(doc) == [f"docs/distributed.md:{n}: daemon/distribute.py does not exist"]


def test_a_dotted_name_that_moved_is_found() -> None:
    name = "docs/checkpoint-format.md"
    doc, n = drifted(name, ".checkpoint.manifest.encode_manifest", ".manifest.encode_manifest")
    assert dotted_problems(doc) == [
        f"{name}:{n}: andrea.daemon.manifest.encode_manifest is neither a module nor an attribute of one"
    ]
    doc, n = drifted("docs/satellite-files.md", "read_entries,", "read_all,")
    assert dotted_problems(doc) == [
        f"docs/satellite-files.md:{n}: andrea.daemon.rundir.losslog.read_all is neither a module nor an "
        "attribute of one"
    ]


def test_a_flag_is_checked_against_the_command_it_follows() -> None:
    doc, n = drifted("README.md", "stop --run-dir DIR [--wait]", "stop --run-dir DIR [--wiat]")
    assert flag_problems(doc) == [f"README.md:{n}: --wiat is not an option of andreactl stop"]
    # Real options, written after the wrong command:
    name = "docs/operations.md"
    doc, n = drifted(name, "prune --keep-latest 2", "checkpoints --keep-latest 2")
    assert flag_problems(doc) == [
        f"{name}:{n}: --keep-latest is not an option of andreactl checkpoints"
    ]
    doc, n = drifted("README.md", "andrea-proxy   --run-dir DIR", "andrea-proxy   --max-steps N")
    assert flag_problems(doc) == [f"README.md:{n}: --max-steps is not an option of andrea-proxy"]
    # A flag named without its command must be some command's.
    doc, n = drifted("docs/evaluation.md", "(`--eval-every N`)", "(`--evaluate-every N`)")
    assert flag_problems(doc) == [
        f"docs/evaluation.md:{n}: --evaluate-every is no command's option"
    ]


def test_a_list_of_stop_reasons_that_lacks_one_is_found() -> None:
    name = "docs/distributed.md"
    doc, n = drifted(name, ", `diverged`)", ")")
    assert reason_problems(doc) == [  # reported where the list begins, a line above
        f"{name}:{n - 1}: stop reasons listed as {sorted(STOP_REASONS - {'diverged'})}, "
        f"the code has {sorted(STOP_REASONS)}"
    ]


def test_a_trigger_that_does_not_exist_is_found() -> None:
    doc, n = drifted("docs/resume-proof.md", "`trigger: sigterm`", "`trigger: sigkill`")
    assert reason_problems(doc) == [
        f"docs/resume-proof.md:{n}: sigkill is not a checkpoint trigger"
    ]
    name = "docs/checkpoint-format.md"
    doc, n = drifted(name, "`sigint`, `sighup`,", "`sigint`,")
    assert model_table_problems(doc, "The manifest", Manifest) == [
        f"{name}:{n}: trigger lists {sorted(TRIGGERS - {'sighup'})}, the code has {sorted(TRIGGERS)}"
    ]


def test_a_manifest_field_missing_from_the_docs_or_not_in_the_model_is_found() -> None:
    name = "docs/checkpoint-format.md"
    doc, _ = drifted(name, "| `distributed` |", "| `distributed_state` |")
    problems = model_table_problems(doc, "The manifest", Manifest)
    assert problems[0].endswith("Manifest has no field distributed_state")
    assert problems[1:] == [f"{name}: the table lacks Manifest.distributed"]
    doc, n = drifted(name, ", `nccl` (null", " (null")
    assert model_table_problems(doc, "The manifest", Manifest) == [
        f"{name}:{n}: the environment row does not name ['nccl']"
    ]
    doc, n = drifted("docs/distributed.md", "`environment.world_size`", "`environment.world`")
    assert setting_problems(doc) == [
        f"docs/distributed.md:{n}: environment.world is neither a setting nor a manifest field"
    ]


def test_a_module_missing_from_the_architecture_page_or_in_the_wrong_folder_is_found() -> None:
    name = "docs/architecture.md"
    doc, _ = drifted(
        name, "`hold_registry.py` (the identified hold a pivot's proxy asks for), ", ""
    )
    assert architecture_problems(doc) == []  # the tree and the trainer's table still name it
    doc = Doc(name, re.sub(r"\| `links/hold_registry\.py` \|.*\n", "", doc.text, count=1))
    assert architecture_problems(doc) == []  # the tree still names it
    doc = Doc(name, doc.text.replace("daemon/trainer/links/hold_registry.py\n", "", 1))
    assert architecture_problems(doc) == [
        f"{name}: daemon/trainer/links/hold_registry.py is not on the page"
    ]
    doc, n = drifted(name, "`catalog.py` (what", "`durable.py` (what")
    doc, n = Doc(name, doc.text.replace("daemon/checkpoint/catalog.py\n", "", 1)), n - 1
    assert architecture_problems(doc) == [
        f"{name}:{n}: durable.py is no module of daemon/checkpoint/",
        f"{name}: daemon/checkpoint/catalog.py is not on the page",
    ]


def test_a_link_to_a_heading_that_does_not_exist_is_found() -> None:
    texts = {d.name: d.text for d in DOCS}
    name = "docs/distributed.md"
    doc, n = drifted(name, "performance.md#8-data", "performance.md#9-data")
    assert link_problems(doc, texts) == [
        f"{name}:{n}: performance.md#9-data-parallelism-torchrun--ddp-and-the-cuda-paths is no "
        "heading there"
    ]
