"""The lines of daemon/, control/ and scripts/gpu_check.py that only a CUDA device reaches and that
the CPU test run never executed: coverage.py's missed lines, kept where the code's own structure
puts them behind a CUDA condition.

    .venv/bin/python -m coverage run -m pytest -q -p no:randomly -m "not process"
    .venv/bin/python -m coverage json -o build/coverage/coverage.json
    .venv/bin/python scripts/cuda_lines.py build/coverage/coverage.json

(pyproject.toml's [tool.coverage.run] names the sources and keeps the data under build/.)

Each `if`'s test is evaluated, with three-valued logic, on the CPU run and on a CUDA one
(`device.type == "cuda"`, `torch.cuda.is_available()`, `is_bf16_supported()`, gpu_check's
`dry_run`: see `value`). A missed line counts when it sits in a branch the CPU run never enters and
a CUDA one may, or after an `if` whose other branch, the CPU's, leaves the block (`if device.type
!= "cuda": return ...`); in a branch only CUDA-made data enters (a manifest's CUDA generator
states); behind a test of an attribute only CUDA code sets (SET_ONLY_ON_CUDA); or in a function
only CUDA code calls (CUDA_ONLY_FUNCTIONS). The last two are listed by reading the code. A
branch neither run enters (gpu_check's refusal without a GPU and without --dry-run) does not
count. A conditional expression (`a if cuda else b`) is one statement, which coverage counts as one
line that runs on every device: it never holds a CUDA-only line.

Prints the lines grouped by guard, then the count; `--json` prints them as {path: [line, ...]}.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

#: A test that mentions one of these may decide between the CUDA path and the CPU one.
GUARD = re.compile(r"cuda|nccl|bf16|bfloat16", re.IGNORECASE)
#: What a test asks of the machine: false on the CPU run, true on a CUDA one.
DEVICE_QUERY = re.compile(
    r"cuda\.is_available\(\)|cuda\.is_initialized\(\)|_cuda_initialised\(\)|\bis_cuda\b|^cuda$"
)
#: False on the CPU run, unknown on a CUDA one (true on an H200, false on older GPUs).
CAPABILITY_QUERY = re.compile(r"is_bf16_supported\(\)")
GPU_CHECK = "scripts/gpu_check.py"
#: scripts/gpu_check.py: the dry run is the CPU rehearsal, the other run needs CUDA.
GPU_CHECK_DRY_RUN = re.compile(r"\bdry_run$")

#: Attributes that only CUDA code sets (CUDA events, by reading where they are assigned): None on
#: the CPU run, so a test of them is a CUDA test. path -> {expression: where it is set}.
SET_ONLY_ON_CUDA: dict[str, dict[str, str]] = {
    "daemon/checkpoint/writer.py": {
        "self._event": "_copy_aside",
        "self._unguarded": "_copy_aside",
    },
    "daemon/trainer/step.py": {
        "self.event": "Mark.__init__, `if device.type == 'cuda'`",
        "earlier.event": "Mark.__init__, `if device.type == 'cuda'`",
    },
}

#: Functions with no CUDA test of their own that only CUDA code calls (by reading their callers):
#: path -> {qualified name: the caller's guard}.
CUDA_ONLY_FUNCTIONS: dict[str, dict[str, str]] = {
    "daemon/checkpoint/writer.py": {
        "StagingBuffer._copy_aside": "fill: `if self.device.type == 'cuda'`",
    },
}

TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def in_scope(path: str) -> bool:
    return path.startswith(("daemon/", "control/")) or path == GPU_CHECK


@dataclass(frozen=True)
class Value:
    """A test's value on the CPU run and on a CUDA one (None: not known from the code), and
    whether what is not known depends on CUDA-made data (a manifest's CUDA generator states)."""

    cpu: bool | None
    cuda: bool | None
    cuda_data: bool = False


UNKNOWN = Value(None, None)


def _and(a: bool | None, b: bool | None) -> bool | None:
    return False if a is False or b is False else None if a is None or b is None else True


def _or(a: bool | None, b: bool | None) -> bool | None:
    return True if a is True or b is True else None if a is None or b is None else False


def _not(a: bool | None) -> bool | None:
    return None if a is None else not a


def value(test: ast.expr, path: str) -> Value:
    """`test` evaluated in both worlds, with three-valued logic over its `and`, `or` and `not`."""
    if isinstance(test, ast.BoolOp):
        values = [value(v, path) for v in test.values]
        op = _and if isinstance(test.op, ast.And) else _or
        out = values[0]
        for v in values[1:]:
            out = Value(op(out.cpu, v.cpu), op(out.cuda, v.cuda), out.cuda_data or v.cuda_data)
        return out
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        v = value(test.operand, path)
        return Value(_not(v.cpu), _not(v.cuda), v.cuda_data)
    text = ast.unparse(test)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq | ast.NotEq)
        and any(isinstance(c, ast.Constant) and c.value == "cuda" for c in test.comparators)
    ):
        eq = isinstance(test.ops[0], ast.Eq)
        return Value(not eq, eq)
    set_on_cuda = SET_ONLY_ON_CUDA.get(path, {})
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Is | ast.IsNot)
        and ast.unparse(test.left) in set_on_cuda
    ):
        is_none = isinstance(test.ops[0], ast.Is)
        return Value(is_none, None)
    if text in set_on_cuda:
        return Value(False, None)
    if DEVICE_QUERY.search(text):
        return Value(False, True)
    if CAPABILITY_QUERY.search(text):
        return Value(False, None)
    if path == GPU_CHECK and GPU_CHECK_DRY_RUN.search(text):
        return Value(True, False)
    return Value(None, None, bool(GUARD.search(text)))


@dataclass(frozen=True)
class Guard:
    """Why a line is CUDA-only: the guard's line and its text."""

    line: int
    text: str


def _lines(node: ast.AST) -> range:
    end = getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]
    return range(node.lineno, end + 1)  # type: ignore[attr-defined]


class _Finder(ast.NodeVisitor):
    """Maps each line behind a CUDA guard to its innermost guard."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.guarded: dict[int, Guard] = {}
        self._scope: list[str] = []
        self._functions = CUDA_ONLY_FUNCTIONS.get(path, {})

    def _mark(self, nodes: list[ast.AST], guard: Guard) -> None:
        for node in nodes:
            for line in _lines(node):
                self.guarded[line] = guard

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self._scope.append(node.name)
        name = ".".join(self._scope)
        if name in self._functions and not isinstance(node, ast.ClassDef):
            self._mark(
                list(node.body), Guard(node.lineno, f"only called by {self._functions[name]}")
            )
        self.generic_visit(node)
        self._scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _function

    def generic_visit(self, node: ast.AST) -> None:
        # Outer guards first, so that an inner guard's mark replaces theirs.
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                self._block(block)
        super().generic_visit(node)

    def _block(self, block: list) -> None:
        for i, stmt in enumerate(block):
            if not isinstance(stmt, ast.If):
                continue
            v = value(stmt.test, self.path)
            # The body is CUDA-only where the CPU run never enters it and a CUDA one may (or where
            # only CUDA-made data enters it); the else branch where the CPU run always skips it.
            body = (v.cpu is False and v.cuda is not False) or (v.cpu is None and v.cuda_data)
            orelse = v.cpu is True and v.cuda is not True
            guard = Guard(stmt.lineno, ast.unparse(stmt.test))
            if body:
                self._mark(stmt.body, guard)
            if orelse:
                self._mark(stmt.orelse, guard)
            # What follows an `if` one of whose branches leaves the block is reached only
            # through the other.
            ends = [bool(b) and isinstance(b[-1], TERMINAL) for b in (stmt.body, stmt.orelse)]
            if (ends[0] and orelse) or (ends[1] and body):
                self._mark(block[i + 1 :], guard)


def guarded_lines(path: str, source: str) -> dict[int, Guard]:
    """Every line of `source` behind a CUDA guard, with its innermost guard."""
    finder = _Finder(path)
    finder.visit(ast.parse(source, path))
    return finder.guarded


def cuda_only_missed(report: dict, root: Path) -> dict[str, dict[int, Guard]]:
    """From coverage's JSON report: path -> {missed CUDA-only line: its guard}."""
    found: dict[str, dict[int, Guard]] = {}
    for name, entry in sorted(report["files"].items()):
        path = Path(name)
        rel = (path.relative_to(root) if path.is_absolute() else path).as_posix()
        if not in_scope(rel):
            continue
        guarded = guarded_lines(rel, (root / rel).read_text())
        hits = {n: guarded[n] for n in entry["missing_lines"] if n in guarded}
        if hits:
            found[rel] = hits
    return found


def _ranges(lines: list[int]) -> str:
    out: list[str] = []
    for n in sorted(lines):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="coverage json's output")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="print {path: [line, ...]}")
    a = parser.parse_args(argv)
    try:
        report = json.loads(a.report.read_text())
    except (OSError, ValueError) as e:
        print(f"cuda_lines: cannot read {a.report}: {e}", file=sys.stderr)
        return 2
    found = cuda_only_missed(report, a.root.resolve())
    if a.json:
        print(json.dumps({p: sorted(h) for p, h in found.items()}, indent=1))
        return 0
    for path, hits in found.items():
        by_guard: dict[Guard, list[int]] = {}
        for line, guard in hits.items():
            by_guard.setdefault(guard, []).append(line)
        for guard, lines in sorted(by_guard.items(), key=lambda g: g[0].line):
            print(f"{path}:{_ranges(lines)}  ({len(lines)}; guard line {guard.line}: {guard.text})")
    total = sum(len(h) for h in found.values())
    print(f"{total} CUDA-only lines never executed, in {len(found)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
