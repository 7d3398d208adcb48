"""The tool call a chat's `tool_choice` forces, as SGLang constrains one (`required`, or a
function named): a call of the named function, or of the first offered, with arguments its
parameters' schema admits."""

from __future__ import annotations

import json
from typing import Any


def forced_call(tools: list[Any] | None, choice: Any) -> dict[str, str] | None:
    """The call a chat's tool_choice forces ("required": the first tool offered; a named
    function: that one), with arguments its parameters' schema admits; None if none is."""
    if not tools:
        return None
    offered = [t.get("function") or {} for t in tools if isinstance(t, dict)]
    if choice == "required":
        function = offered[0] if offered else None
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        function = next((f for f in offered if f.get("name") == name), None)
    else:
        return None
    if not function or not isinstance(function.get("name"), str):
        return None
    arguments = _instance(function.get("parameters") or {"type": "object"})
    return {"name": function["name"], "arguments": json.dumps(arguments)}


def _instance(schema: Any) -> Any:
    """A small value that `schema` admits: its required properties, each of its type."""
    if not isinstance(schema, dict):
        return {}
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object":
        properties = schema.get("properties") or {}
        return {name: _instance(properties.get(name, {})) for name in schema.get("required", [])
                if isinstance(name, str)}  # fmt: skip
    return {"string": "x", "integer": 1, "number": 1, "boolean": True, "array": [],
            "null": None}.get(kind, {})  # fmt: skip
