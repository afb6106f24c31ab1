"""Generic comparison of two nested JSON-like structures, for the resume proofs.

A resume proof compares what two runs report (per-step records, weights, optimizer state, ...) and
must never accept an unusable output: a NaN, a missing key, a list of another length or a value of
another type is a failure in its own right, never a "difference of zero". Floats are compared with an
absolute tolerance only (the protocols fix the relative tolerance at 0); a tolerance of 0 means
bit-for-bit equality, so even ``-0.0`` against ``0.0`` is reported. Integers, strings, booleans and
``None`` are compared exactly whatever the tolerance.

The result records are pydantic models because they end up in ``verification.json``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, computed_field

from andrea.daemon.checkpoint.manifest import LayoutEntry

#: The first issues of each kind are kept verbatim; the rest are only counted, so that a report on a
#: completely different run stays readable.
MAX_ISSUES_KEPT = 20


class IssueKind(StrEnum):
    """What went wrong at one place of the structure."""

    MISSING_KEY = "missing_key"
    """The key is in the reference (left) but not in the candidate (right)."""
    EXTRA_KEY = "extra_key"
    """The key is in the candidate but not in the reference."""
    LENGTH_MISMATCH = "length_mismatch"
    """Two lists of different lengths (a different shape, for nested lists)."""
    TYPE_MISMATCH = "type_mismatch"
    """Different JSON types at the same place (an int is not a float, a bool is not an int)."""
    UNSUPPORTED_TYPE = "unsupported_type"
    """A value that is not JSON-like (e.g. a tensor that was never converted)."""
    NON_FINITE = "non_finite"
    """NaN or an infinity on either side: never accepted, even when both sides agree."""
    VALUE_MISMATCH = "value_mismatch"
    """Comparable values that differ beyond the tolerance."""


STRUCTURAL_KINDS = frozenset(
    {
        IssueKind.MISSING_KEY,
        IssueKind.EXTRA_KEY,
        IssueKind.LENGTH_MISMATCH,
        IssueKind.TYPE_MISMATCH,
        IssueKind.UNSUPPORTED_TYPE,
    }
)


class Issue(BaseModel):
    """One place where the two structures disagree."""

    model_config = ConfigDict(frozen=True)

    kind: IssueKind
    path: str = Field(
        description="Location, e.g. `$.state.0.exp_avg[3][1]`; `$` is the compared value."
    )
    left: str | None = Field(default=None, description="Short rendering of the reference value.")
    right: str | None = Field(default=None, description="Short rendering of the candidate value.")
    abs_diff: float | None = Field(default=None, description="|left - right| for numbers.")


class Comparison(BaseModel):
    """The comparison of one named quantity between a reference and a candidate."""

    model_config = ConfigDict(frozen=True)

    name: str
    atol: float = Field(ge=0.0, description="Absolute tolerance for floats; 0 means bit-for-bit.")
    leaves_compared: int = Field(
        ge=0, description="Leaf values present on both sides with the same type."
    )
    numbers_compared: int = Field(ge=0, description="Finite numeric leaves among them.")
    max_abs_diff: float = Field(
        ge=0.0,
        description="Largest |left - right| over the finite numeric leaves present on both sides.",
    )
    counts: dict[IssueKind, int] = Field(
        description="Number of issues of each kind (all of them, kept or not)."
    )
    issues: list[Issue] = Field(description=f"The first {MAX_ISSUES_KEPT} issues of each kind.")

    @computed_field  # type: ignore[prop-decorator]  # mypy refuses a decorated property
    @property
    def structural_issues(self) -> int:
        """Missing/extra keys, length, type and unsupported-value issues."""
        return sum(n for kind, n in self.counts.items() if kind in STRUCTURAL_KINDS)

    @computed_field  # type: ignore[prop-decorator]  # mypy refuses a decorated property
    @property
    def non_finite(self) -> int:
        """Places where either side holds NaN or an infinity."""
        return self.counts.get(IssueKind.NON_FINITE, 0)

    @computed_field  # type: ignore[prop-decorator]  # mypy refuses a decorated property
    @property
    def value_mismatches(self) -> int:
        """Comparable leaves that differ beyond the tolerance."""
        return self.counts.get(IssueKind.VALUE_MISMATCH, 0)

    @computed_field  # type: ignore[prop-decorator]  # mypy refuses a decorated property
    @property
    def sound(self) -> bool:
        """Same structure and only finite numbers: the values could be compared everywhere."""
        return self.structural_issues == 0 and self.non_finite == 0

    @computed_field  # type: ignore[prop-decorator]  # mypy refuses a decorated property
    @property
    def passed(self) -> bool:
        """Sound and every value within tolerance: the candidate reproduces the reference."""
        return self.sound and self.value_mismatches == 0

    @computed_field  # type: ignore[prop-decorator]  # mypy refuses a decorated property
    @property
    def diverged(self) -> bool:
        """Sound but some value differs: a genuine divergence rather than an unusable output."""
        return self.sound and self.value_mismatches > 0


def compare(name: str, left: Any, right: Any, atol: float) -> Comparison:
    """Compare ``right`` (the candidate) against ``left`` (the reference).

    Both are JSON-like: dicts with string keys, lists or tuples, floats, ints, bools, strings, None.
    Floats match when ``|left - right| <= atol``; with ``atol == 0`` they must have identical bits.
    """
    if not (atol >= 0.0 and math.isfinite(atol)):
        raise ValueError(f"atol must be a finite number >= 0, got {atol!r}")
    walk = _Walk(atol)
    walk.visit("$", left, right)
    return Comparison(
        name=name,
        atol=atol,
        leaves_compared=walk.leaves,
        numbers_compared=walk.numbers,
        max_abs_diff=walk.max_abs_diff,
        counts=dict(walk.counts),
        issues=walk.issues,
    )


def compare_all(pairs: Mapping[str, tuple[Any, Any]], atol: float) -> list[Comparison]:
    """Compare several named quantities, each given as ``(reference, candidate)``, in order."""
    return [compare(name, left, right, atol) for name, (left, right) in pairs.items()]


def _kind(value: Any) -> str:
    # bool before int: True is an int to Python but a different JSON type.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, Sequence):
        return "array"
    return "unsupported"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Walk:
    """Accumulates the statistics of one recursive comparison."""

    def __init__(self, atol: float) -> None:
        self.atol = atol
        self.leaves = 0
        self.numbers = 0
        self.max_abs_diff = 0.0
        self.counts: dict[IssueKind, int] = {}
        self.issues: list[Issue] = []

    def report(
        self,
        kind: IssueKind,
        path: str,
        left: Any = None,
        right: Any = None,
        diff: float | None = None,
    ) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= MAX_ISSUES_KEPT:
            self.issues.append(
                Issue(
                    kind=kind,
                    path=path,
                    left=None if left is None else _short(left),
                    right=None if right is None else _short(right),
                    abs_diff=diff,
                )
            )

    def visit(self, path: str, left: Any, right: Any) -> None:
        left_kind, right_kind = _kind(left), _kind(right)
        if "unsupported" in (left_kind, right_kind):
            self.report(IssueKind.UNSUPPORTED_TYPE, path, type(left).__name__, type(right).__name__)
            return
        if left_kind != right_kind:
            self.report(IssueKind.TYPE_MISMATCH, path, left_kind, right_kind)
            return
        if left_kind == "object":
            self.visit_object(path, left, right)
        elif left_kind == "array":
            self.visit_array(path, left, right)
        else:
            self.leaves += 1
            if left_kind == "float":
                self.visit_float(path, left, right)
            elif left_kind == "int":
                self.visit_int(path, left, right)
            elif left != right:
                self.report(IssueKind.VALUE_MISMATCH, path, left, right)

    def visit_object(self, path: str, left: Mapping[Any, Any], right: Mapping[Any, Any]) -> None:
        for key in left:
            if key not in right:
                self.report(IssueKind.MISSING_KEY, f"{path}.{key}")
        for key in right:
            if key not in left:
                self.report(IssueKind.EXTRA_KEY, f"{path}.{key}")
        for key in left:
            if key in right:
                self.visit(f"{path}.{key}", left[key], right[key])

    def visit_array(self, path: str, left: Sequence[Any], right: Sequence[Any]) -> None:
        if len(left) != len(right):
            self.report(
                IssueKind.LENGTH_MISMATCH, path, f"length {len(left)}", f"length {len(right)}"
            )
        # The common prefix is still compared so that the report shows how far the values agree.
        for index, (a, b) in enumerate(zip(left, right, strict=False)):
            self.visit(f"{path}[{index}]", a, b)

    def visit_int(self, path: str, left: int, right: int) -> None:
        self.numbers += 1
        diff = float(abs(left - right))
        self.max_abs_diff = max(self.max_abs_diff, diff)
        if left != right:
            self.report(IssueKind.VALUE_MISMATCH, path, left, right, diff)

    def visit_float(self, path: str, left: float, right: float) -> None:
        if not (math.isfinite(left) and math.isfinite(right)):
            self.report(IssueKind.NON_FINITE, path, left, right)
            return
        self.numbers += 1
        diff = abs(left - right)
        self.max_abs_diff = max(self.max_abs_diff, diff)
        if self.atol == 0.0:
            # Bit-for-bit: == alone would accept -0.0 for 0.0.
            same = left == right and math.copysign(1.0, left) == math.copysign(1.0, right)
        else:
            same = diff <= self.atol
        if not same:
            self.report(IssueKind.VALUE_MISMATCH, path, left, right, diff)


class _ArrayWalk:
    """Accumulates the statistics of one vectorised comparison of payload arrays."""

    def __init__(self, layout: Sequence[LayoutEntry]) -> None:
        self.layout = layout
        self.offsets = np.array([entry.offset for entry in layout], dtype=np.int64)
        self.leaves = 0
        self.numbers = 0
        self.max_abs_diff = 0.0
        self.counts: dict[IssueKind, int] = {}
        self.issues: list[Issue] = []

    def where(self, label: str, flat_index: int) -> str:
        """The tensor and index of a flat position, as an issue's path."""
        entry = self.layout[int(np.searchsorted(self.offsets, flat_index, side="right")) - 1]
        index = np.unravel_index(flat_index - entry.offset, tuple(entry.shape))
        return f"$.{label}.{entry.name}" + "".join(f"[{int(i)}]" for i in index)

    def report(
        self, kind: IssueKind, found: np.ndarray, label: str, left: np.ndarray, right: np.ndarray
    ) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + int(found.size)
        for i in found[: max(0, MAX_ISSUES_KEPT - (self.counts[kind] - int(found.size)))]:
            a, b = float(left[i]), float(right[i])
            diff = abs(a - b) if kind is IssueKind.VALUE_MISMATCH else None
            self.issues.append(
                Issue(
                    kind=kind,
                    path=self.where(label, int(i)),
                    left=repr(a),
                    right=repr(b),
                    abs_diff=diff,
                )
            )

    def visit(self, label: str, left: np.ndarray, right: np.ndarray) -> None:
        if left.shape != right.shape:
            kind = IssueKind.LENGTH_MISMATCH
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.issues.append(
                Issue(
                    kind=kind,
                    path=f"$.{label}",
                    left=f"length {left.size}",
                    right=f"length {right.size}",
                )
            )
            return
        self.leaves += left.size
        finite = np.isfinite(left) & np.isfinite(right)
        self.numbers += int(finite.sum())
        # Bit patterns, not ==: -0.0 against 0.0 is a difference here, as in compare().
        differ = finite & (left.view(np.uint32) != right.view(np.uint32))
        diff = np.abs(left.astype(np.float64) - right.astype(np.float64))
        self.max_abs_diff = max(self.max_abs_diff, float(diff[finite].max(initial=0.0)))
        self.report(IssueKind.NON_FINITE, np.flatnonzero(~finite), label, left, right)
        self.report(IssueKind.VALUE_MISMATCH, np.flatnonzero(differ), label, left, right)


def compare_arrays(
    name: str, layout: Sequence[LayoutEntry], groups: Sequence[tuple[str, np.ndarray, np.ndarray]]
) -> Comparison:
    """Compare flat float32 payload arrays bit for bit, with :mod:`compare`'s rules and report.

    ``groups`` are ``(label, reference, candidate)``, each array flattened in ``layout`` order, so that an
    issue names its tensor and index (``$.m.blocks.0.attn.c_attn.weight[3][7]``). Vectorised: a payload
    has 137k numbers per array even for the tiny preset, too many for the generic recursive walk.
    """
    walk = _ArrayWalk(layout)
    for label, left, right in groups:
        walk.visit(label, left, right)
    return Comparison(
        name=name,
        atol=0.0,
        leaves_compared=walk.leaves,
        numbers_compared=walk.numbers,
        max_abs_diff=walk.max_abs_diff,
        counts={kind: n for kind, n in walk.counts.items() if n},
        issues=walk.issues,
    )
