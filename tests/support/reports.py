"""Checking a command's JSON report against the schema `andreactl schema` prints, and the timestamp
form reports use; shared by the report tests."""

from __future__ import annotations

import json
import re

import pytest

from andrea.control import andreactl
from andrea.control.reports import (
    report_adapter,
)


def check(command: str, stdout: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Validate one document of ``command`` against the schema `andreactl schema` prints for it;
    the name of the model it is (the one alternative it fits)."""
    doc = json.loads(stdout)
    schema = printed_schema(command, capsys)
    fitting = [title for title, v in variants(schema).items() if not errors(v, doc, schema)]
    assert len(fitting) == 1, (command, [errors(v, doc, schema) for v in variants(schema).values()])
    model = type(report_adapter(command).validate_json(stdout)).__name__
    assert model == fitting[0], (command, model, fitting)
    return model


RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def printed_schema(command: str, capsys: pytest.CaptureFixture[str]) -> dict:
    assert andreactl.main(["schema", command]) == 0
    return json.loads(capsys.readouterr().out)


def variants(schema: dict) -> dict[str, dict]:
    """Title → object schema of each document a schema accepts (one, or each of its anyOf)."""
    if "anyOf" not in schema:
        return {schema["title"]: schema}
    refs = [alt["$ref"].rsplit("/", 1)[1] for alt in schema["anyOf"]]
    return {ref: schema["$defs"][ref] for ref in refs}


def errors(schema: dict, doc: object, root: dict, at: str = "$") -> list[str]:
    """Where ``doc`` breaks ``schema``: the JSON Schema keywords pydantic writes for these models."""
    if "$ref" in schema:
        return errors(root["$defs"][schema["$ref"].rsplit("/", 1)[1]], doc, root, at)
    if "anyOf" in schema:
        tries = [errors(alt, doc, root, at) for alt in schema["anyOf"]]
        return [] if any(not e for e in tries) else [f"{at}: no alternative fits: {tries}"]
    kind = schema.get("type")
    if kind is not None and (
        not isinstance(doc, TYPES[kind]) or (isinstance(doc, bool) and kind != "boolean")
    ):
        return [f"{at}: {doc!r} is not {kind}"]
    if "const" in schema and doc != schema["const"]:
        return [f"{at}: {doc!r} != {schema['const']!r}"]
    if "enum" in schema and doc not in schema["enum"]:
        return [f"{at}: {doc!r} not in {schema['enum']}"]
    if "minimum" in schema and doc < schema["minimum"]:
        return [f"{at}: {doc!r} < {schema['minimum']}"]
    if schema.get("format") == "date-time" and not RFC3339.match(doc):
        return [f"{at}: {doc!r} is not RFC 3339"]
    out = []
    if kind == "array":
        for i, item in enumerate(doc):
            out += errors(schema.get("items", {}), item, root, f"{at}[{i}]")
    if kind == "object":
        props = schema.get("properties", {})
        out += [f"{at}: {k} missing" for k in schema.get("required", ()) if k not in doc]
        for k, v in doc.items():
            out += errors(schema.get("propertyNames", {}), k, root, f"{at} key {k}")
            extra = schema.get("additionalProperties", True)
            if k in props:
                out += errors(props[k], v, root, f"{at}.{k}")
            elif extra is False:
                out.append(f"{at}.{k}: not in the schema")
            elif isinstance(extra, dict):
                out += errors(extra, v, root, f"{at}.{k}")
    return out


TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}
