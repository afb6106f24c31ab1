"""The comparison engine of the resume proof: what it accepts, and every kind of difference it reports."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from andrea.control.compare import IssueKind, compare

ATOL = 1e-12


def test_compare_accepts_identical_structures() -> None:
    value = {"w": [[1.0, -2.5], [3.0, 0.0]], "step": 10, "name": "adam", "flag": True, "none": None}
    result = compare("state", value, json.loads(json.dumps(value)), 0.0)
    assert result.passed and result.max_abs_diff == 0.0 and result.leaves_compared == 8


def test_compare_never_accepts_non_finite_values() -> None:
    result = compare("loss", [1.0, math.nan], [1.0, math.nan], ATOL)
    assert not result.passed and not result.diverged and result.non_finite == 1
    assert result.issues[0].path == "$[1]"
    assert compare("loss", {"x": 1.0}, {"x": math.inf}, ATOL).counts == {IssueKind.NON_FINITE: 1}


def test_compare_reports_missing_and_extra_keys() -> None:
    result = compare(
        "optimizer", {"lr": 0.1, "betas": [0.9, 0.999]}, {"lr": 0.1, "eps": 1e-8}, ATOL
    )
    assert not result.passed and not result.sound
    assert {(i.kind, i.path) for i in result.issues} == {
        (IssueKind.MISSING_KEY, "$.betas"),
        (IssueKind.EXTRA_KEY, "$.eps"),
    }


def test_compare_reports_a_shape_mismatch() -> None:
    result = compare("weights", [[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0, 3.0, 4.0]], ATOL)
    assert not result.passed and result.counts[IssueKind.LENGTH_MISMATCH] == 2
    assert {i.path for i in result.issues if i.kind is IssueKind.LENGTH_MISMATCH} == {"$", "$[0]"}


def test_compare_reports_type_changes() -> None:
    assert compare("step", 10, 10.0, ATOL).counts == {IssueKind.TYPE_MISMATCH: 1}
    assert compare("flag", True, 1, ATOL).counts == {IssueKind.TYPE_MISMATCH: 1}


def test_compare_catches_1e_11_at_tolerance_1e_12() -> None:
    result = compare("weights", {"w": [0.5, 0.25]}, {"w": [0.5, 0.25 + 1e-11]}, ATOL)
    assert not result.passed and result.diverged and result.value_mismatches == 1
    assert math.isclose(result.max_abs_diff, 1e-11, rel_tol=1e-3)
    assert result.issues[0].path == "$.w[1]"
    assert compare("weights", {"w": [0.25]}, {"w": [0.25 + 1e-13]}, ATOL).passed


def test_compare_at_zero_tolerance_is_bitwise() -> None:
    assert not compare("w", [0.0], [-0.0], 0.0).passed
    assert not compare("w", [0.1 + 0.2], [0.3], 0.0).passed
    assert compare("w", [0.1 + 0.2], [0.30000000000000004], 0.0).passed


_json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_json_like)
def test_compare_accepts_any_finite_structure_against_its_json_copy(value: Any) -> None:
    assert compare("x", value, json.loads(json.dumps(value)), 0.0).passed
