"""How a pydantic validation error is told to a person: one formatter for every file and message.

Each problem names its key and the reason (``arms.code.flor: unknown key``), never pydantic's
headline ("1 validation error for Policy") or its "Value error, " prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

#: Given a problem's location (pydantic's loc tuple), text to add after it, e.g. where it came from.
Note = Callable[[tuple[Any, ...]], str]


def problems(err: ValidationError, note: Note | None = None) -> list[str]:
    """One ``location: reason`` line per problem (``location note: reason`` with a `note`)."""
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        reason = (
            "unknown key"
            if e["type"] == "extra_forbidden"
            else e["msg"].removeprefix("Value error, ")
        )
        out.append(f"{loc}{note(e['loc']) if note else ''}: {reason}")
    return out


def describe(err: ValidationError, what: str, note: Note | None = None) -> str:
    """``what:`` then every problem on its own indented line (for a file a person edits)."""
    return "\n".join([f"{what}:", *(f"  {p}" for p in problems(err, note))])


def first_problem(err: ValidationError) -> str:
    """The first problem on one line, with how many more there are (for a one-line report)."""
    found = problems(err)
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{found[0]}{more}" if found else str(err).splitlines()[0]
