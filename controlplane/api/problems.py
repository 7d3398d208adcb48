"""Every error becomes an RFC 9457 problem, here and nowhere else."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from controlplane.errors import MeridianError

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

_HTTP_CODES = {
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    406: ("not_acceptable", "Not acceptable"),
    413: ("payload_too_large", "Payload too large"),
}


def problem(
    status: int, code: str, title: str, detail: str, instance: str, **extra: Any
) -> JSONResponse:
    body = {
        "type": f"urn:meridian:problem:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "instance": instance,
        **extra,
    }
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _field_errors(exc: RequestValidationError) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        out.append(
            {
                "field": ".".join(loc) or "body",
                "message": err.get("msg", ""),
                "type": err.get("type", ""),
            }
        )
    return out


def _allowed(request: Request) -> set[str]:
    return _methods(request.app.routes, {**request.scope, "method": "GET"})


def _methods(routes: Iterable[Any], scope: dict[str, Any]) -> set[str]:
    """The methods of the routes whose path matches the scope's, into included routers."""
    methods: set[str] = set()
    for route in routes:
        inner = getattr(getattr(route, "original_router", None), "routes", None)
        if inner is not None:
            methods |= _methods(inner, scope)
        elif route.matches(scope)[0] != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return methods


def install(app: FastAPI) -> None:
    async def on_meridian(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, MeridianError)
        return problem(exc.status, exc.code, exc.title, exc.detail, request.url.path, **exc.extra)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = _field_errors(exc)
        malformed = any(
            e["type"] == "json_invalid" or (e["type"] == "missing" and e["field"] == "body")
            for e in errors
        )
        code = "malformed_body" if malformed else "validation_failed"
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return problem(
            422, code, "The request is not valid", summary, request.url.path, errors=errors
        )

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 400:  # a body that is not even text: as one that is not JSON
            return problem(422, "malformed_body", "The request is not valid",
                           f"the body cannot be read: {exc.detail}", request.url.path)  # fmt: skip
        code, title = _HTTP_CODES.get(exc.status_code, ("http_error", "HTTP error"))
        answer = problem(exc.status_code, code, title, str(exc.detail), request.url.path)
        if exc.status_code == 405:  # every method the path takes, over all of its routes
            answer.headers["Allow"] = ", ".join(sorted(_allowed(request)))
        return answer

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"path": request.url.path})
        return problem(
            500, "internal", "Internal error", "the server failed; see its log", request.url.path
        )

    app.add_exception_handler(MeridianError, on_meridian)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
