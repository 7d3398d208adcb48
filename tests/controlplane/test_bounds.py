"""Every value a caller can send has bounds the database holds, and the OpenAPI document says
them, so that a generated client, a fuzzer or a typo finds a 422, never a database error."""

from __future__ import annotations

from typing import Any

from tests.kits.controlplane import Api

BIGINT = 2**63 - 1


def _unbounded(schema: dict[str, Any], where: str, out: list[str]) -> None:
    if schema.get("readOnly"):
        return  # accepted and never stored
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            _unbounded(sub, where, out)
    kind = schema.get("type")
    if kind in ("integer", "number"):
        if "maximum" not in schema or "minimum" not in schema:
            out.append(f"{where}: a number without minimum and maximum")
        elif kind == "integer" and max(abs(schema["maximum"]), abs(schema["minimum"])) > BIGINT:
            out.append(f"{where}: beyond a bigint")
    if kind == "string" and not {"maxLength", "pattern", "enum", "const", "format"} & set(schema):
        out.append(f"{where}: a string without maxLength, pattern or enum")
    if kind == "array":
        if "maxItems" not in schema:
            out.append(f"{where}: a list without maxItems")
        _unbounded(schema.get("items", {}), f"{where}[]", out)
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in schema:
                out.append(f"{where}: a map without maxProperties")
            _unbounded(extra, f"{where}.*", out)
    for name, sub in schema.get("properties", {}).items():
        _unbounded(sub, f"{where}.{name}", out)


async def test_every_input_of_the_openapi_document_is_bounded(api: Api) -> None:
    spec = (await api.client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    inputs: set[str] = set()
    found: list[str] = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                where = f"{method.upper()} {path} {parameter['name']}"
                _unbounded(parameter["schema"], where, found)
            for media in operation.get("requestBody", {}).get("content", {}).values():
                ref = media["schema"].get("$ref", "")
                inputs.add(ref.rsplit("/", 1)[-1])
    # the schemas bodies refer to, and the ones those refer to
    todo = [name for name in inputs if name in schemas]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        _unbounded(schemas[name], name, found)
        text = str(schemas[name])
        todo += [other for other in schemas if f"/{other}'" in text and other not in seen]
    assert len(seen) >= 20
    assert not found, "\n".join(found)
