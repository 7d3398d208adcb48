"""The OpenAPI 3.1 document of the agent's public surface (`GET /openapi.json`): the inference
endpoints with their request schemas (agents/gateway/schema.py, the models the gateway checks
requests with), the answers each may give, and the models this region serves now.

Made when asked for (a new snapshot may change the models), never on a request's path.
"""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import models_json_schema

from agents.gateway import schema
from agents.gateway.errors import PROBLEM_JSON

REF = "#/components/schemas/{model}"
ERRORS = {
    "400": "Invalid request: a parameter, the body, or the prompt and answer past the context",
    "401": "No API key, or one that is not valid here",
    "403": "The tenant may not be served in this region's jurisdiction",
    "404": "No such model here",
    "408": "The body came too slowly",
    "413": "The body is too large",
    "415": "The body is not JSON",
    "429": "Over the tenant's quota, or the model is at capacity (see Retry-After)",
    "500": "A fault of the gateway's own (its request id is in X-Request-ID)",
    "502": "The engines failed the request",
    "503": "No worker serves the model now, or the agent has no snapshot yet",
}
LIST_ERRORS = ("401", "403", "500", "503")


def document(models: list[str], version: str) -> dict[str, Any]:
    _, defs = models_json_schema(
        [(m, "validation") for m in (schema.ChatRequest, schema.CompletionRequest,
                                     schema.GenerateRequest)],
        ref_template=REF,
    )  # fmt: skip
    components = defs["$defs"]
    if models:  # the requests name one of the models served here
        for name in ("ChatRequest", "CompletionRequest"):
            components[name]["properties"]["model"] = {"type": "string", "enum": models}
        components["GenerateRequest"]["properties"]["model"] = {
            "anyOf": [{"type": "string", "enum": models}, {"type": "null"}]
        }
    components |= {"Problem": _PROBLEM, "Completion": _COMPLETION, "Model": _MODEL,
                   "ModelList": _MODEL_LIST}  # fmt: skip
    inference = {
        "/v1/chat/completions": ("createChatCompletion", "ChatRequest", "A chat completion"),
        "/v1/completions": ("createCompletion", "CompletionRequest", "A completion"),
        "/generate": ("generate", "GenerateRequest", "SGLang's native generation"),
    }
    paths: dict[str, Any] = {
        path: {"post": _post(op, body, summary)} for path, (op, body, summary) in inference.items()
    }
    paths["/v1/models"] = {"get": _get("listModels", "The models this region serves",
                                       "ModelList", LIST_ERRORS)}  # fmt: skip
    paths["/v1/models/{model}"] = {"get": _get("retrieveModel", "One model", "Model",
                                               (*LIST_ERRORS, "404"))}  # fmt: skip
    paths["/v1/models/{model}"]["get"]["parameters"] = [
        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    ]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Meridian gateway",
            "version": version,
            "description": "A region's OpenAI-compatible endpoint",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
    }


def _post(operation: str, body: str, summary: str) -> dict[str, Any]:
    ok = {
        "description": "The answer, whole or as server-sent events (`stream: true`)",
        "headers": _HEADERS,
        "content": {
            "application/json": {"schema": {"$ref": REF.format(model="Completion")}},
            "text/event-stream": {"schema": _EVENT},
        },
    }
    return {
        "operationId": operation,
        "summary": summary,
        "parameters": [_REQUEST_ID],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=body)}}},
        },
        "responses": {"200": ok, **{code: _error(code) for code in ERRORS}},
    }


def _get(operation: str, summary: str, answer: str, errors: tuple[str, ...]) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": REF.format(model=answer)}}}
    ok = {"description": summary, "headers": _HEADERS, "content": content}
    responses = {"200": ok, **{code: _error(code) for code in errors}}
    return {"operationId": operation, "summary": summary, "responses": responses}


def _error(code: str) -> dict[str, Any]:
    return {
        "description": ERRORS[code],
        "headers": _HEADERS,
        "content": {PROBLEM_JSON: {"schema": {"$ref": REF.format(model="Problem")}}},
    }


_REQUEST_ID = {
    "name": "X-Request-ID",
    "in": "header",
    "required": False,
    "description": "The request's id, returned in the answer; made when not given",
    "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,128}$"},
}
_HEADERS = {"X-Request-ID": {"schema": {"type": "string"}}}
_EVENT = {  # each event of a stream: its data a chunk as JSON, an error, or [DONE]
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
_PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details, which are also OpenAI's error shape",
    "required": ["type", "title", "status", "code", "error"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "code": {"type": "string"},
                "param": {"type": ["string", "null"]},
            },
        },
    },
}
_COMPLETION = {
    "type": ["object", "array"],
    "description": "The engine's answer as it wrote it: OpenAI's (chat) completion object, "
    "or for /generate SGLang's (one object, or a list for a batch)",
}
_MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "max_model_len": {"type": "integer"},
    },
}
_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"},
                   "data": {"type": "array", "items": {"$ref": REF.format(model="Model")}}},
}  # fmt: skip
