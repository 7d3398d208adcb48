"""The OpenAPI document, completed with what FastAPI cannot infer: every problem an operation
can answer (RFC 9457, `application/problem+json`, with its schema), If-Match where a write
needs it, and the bearer token. Generated clients and fuzzers then see the API as it is."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from controlplane.api.deps import ROLE_KEY
from controlplane.api.problems import PROBLEM_JSON

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; `code` is stable",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "for invalid input: each field and what is wrong with it",
            "items": {
                "type": "object",
                "properties": {
                    "field": {"type": "string"},
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                },
            },
        },
    },
    "additionalProperties": True,
}

WHY = {
    401: "no token, or one that is not valid (`unauthenticated`)",
    403: "the token's role may not do this (`forbidden`)",
    404: "no such object (`not_found`)",
    409: "it conflicts with what exists (`already_exists`, `has_dependents`)",
    412: "If-Match, or the body's `version`, is not the object's version (`version_mismatch`)",
    415: "a body in a media type this operation does not take (`unsupported_media_type`)",
    422: "the input is not valid (`validation_failed`, `malformed_body`, `unknown_reference`)",
    428: "If-Match is missing (`precondition_required`)",
    503: "not ready: the database cannot be reached or its schema is not current",
}
IF_MATCH = {"put", "patch", "delete"}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(spec: dict[str, Any]) -> dict[str, Any]:
    components = spec.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Problem"] = PROBLEM_SCHEMA
    for path, operations in spec["paths"].items():
        if "patch" in operations and "put" in operations:
            _merge_patch_body(schemas, operations["put"], operations["patch"])
        for method, operation in operations.items():
            for status in _problems(path, method, operation):
                operation.setdefault("responses", {})[str(status)] = {
                    "description": WHY[status],
                    "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
                }
            if method in IF_MATCH and "{name}" in path:
                for parameter in operation.get("parameters", []):
                    if parameter["name"] == "if-match":
                        parameter.update(
                            required=True,
                            description='the object\'s ETag, e.g. "3", or *',
                            schema={"type": "string", "minLength": 1, "maxLength": 1024},
                        )
    return spec


def _merge_patch_body(schemas: dict[str, Any], put: dict[str, Any], patch: dict[str, Any]) -> None:
    """PATCH's body is a JSON merge patch (RFC 7396) of what PUT takes: the same fields, none
    required, each may be null (null removes it, back to its default), and no others."""
    ref = put["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[1]
    full = schemas[name]
    patch_name = name.removesuffix("Replace") + "Patch"
    schemas[patch_name] = {
        "type": "object",
        "title": patch_name,
        "description": f"a JSON merge patch (RFC 7396) of {name}",
        "properties": {
            field: {"anyOf": [prop, {"type": "null"}]} if prop.get("type") != "null" else prop
            for field, prop in full["properties"].items()
        },
        "additionalProperties": False,
    }
    body = {"schema": {"$ref": f"#/components/schemas/{patch_name}"}}
    patch["requestBody"] = {
        "required": True,
        "content": {"application/json": body, "application/merge-patch+json": body},
    }


def _problems(path: str, method: str, operation: dict[str, Any]) -> list[int]:
    statuses = {422} if operation.get("parameters") or operation.get("requestBody") else set()
    if ROLE_KEY in operation:
        statuses |= {401, 403}
    if path == "/readyz":
        statuses.add(503)
    if "{name}" in path:
        statuses.add(404)
    if method in ("post", "put", "patch", "delete") and path.startswith("/v1/"):
        statuses.add(409)
    if method in IF_MATCH and "{name}" in path:
        statuses |= {412, 428}
    if path == "/v1/apply":
        statuses.add(415)
    return sorted(statuses)
