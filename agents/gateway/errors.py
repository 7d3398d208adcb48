"""The gateway's errors: RFC 9457 problem details with a stable `code`, which are also OpenAI's
error shape (`{"error": {"message", "type", "code", "param"}}`), so both kinds of client
read them. Rendered in one place."""

from __future__ import annotations

import orjson
from aiohttp import web

from agents.errors import AgentError
from agents.router.plan import Refusal, Reject

PROBLEM_JSON = "application/problem+json"
SERVER = "meridian"  # the Server header of every answer (never the software's own)


class GatewayError(AgentError):
    status = 500
    code = "internal_error"
    kind = "api_error"  # OpenAI's error `type`
    title = "Internal error"
    model: str | None = None  # the model asked for, once known (its load goes with the answer)
    headers: dict[str, str] | None = None  # more headers for the answer (x-ratelimit-*)

    def __init__(self, message: str, *, retry_after_s: int | None = None, param: str | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.param = param

    def response(self, headers: dict[str, str]) -> web.Response:
        body = {
            "type": f"urn:meridian:problem:{self.code}",
            "title": self.title,
            "status": self.status,
            "detail": self.message,
            "code": self.code,
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.code,
                "param": self.param,
            },
        }
        headers = {"Server": SERVER, **headers, **(self.headers or {})}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        return web.Response(
            body=orjson.dumps(body), status=self.status, headers=headers, content_type=PROBLEM_JSON
        )


class BadRequest(GatewayError):
    status, code, kind, title = 400, "invalid_request", "invalid_request_error", "Invalid request"


class ContextTooLong(GatewayError):
    status, code, kind = 400, "context_length_exceeded", "invalid_request_error"
    title = "Prompt longer than the model's context"


class CapabilityMissing(GatewayError):
    status, code, kind = 400, "capability_unsupported", "invalid_request_error"
    title = "The model lacks a capability the request needs"


class Unauthenticated(GatewayError):
    status, code, kind, title = 401, "invalid_api_key", "authentication_error", "Unauthenticated"


class Forbidden(GatewayError):
    status, code, kind, title = 403, "forbidden", "permission_error", "Forbidden"


class ModelNotFound(GatewayError):
    status, code, kind, title = 404, "model_not_found", "invalid_request_error", "Unknown model"


class NotFound(GatewayError):
    status, code, kind, title = 404, "not_found", "invalid_request_error", "Not found"


class MethodNotAllowed(GatewayError):
    status, code, kind = 405, "method_not_allowed", "invalid_request_error"
    title = "Method not allowed"


class RequestTimeout(GatewayError):
    status, code, kind, title = 408, "request_timeout", "invalid_request_error", "Request timeout"


class BodyTooLarge(GatewayError):
    status, code, kind, title = 413, "body_too_large", "invalid_request_error", "Body too large"


class UnsupportedMediaType(GatewayError):
    status, code, kind = 415, "unsupported_media_type", "invalid_request_error"
    title = "Unsupported media type"


class QuotaExceeded(GatewayError):
    status, code, kind, title = 429, "quota_exceeded", "rate_limit_error", "Quota exceeded"


class BudgetExceeded(GatewayError):
    """A spend budget of the tenant or its key is spent, or this node's part of it is."""

    status, code, kind, title = 429, "budget_exceeded", "insufficient_quota", "Budget exceeded"


class TenantConcurrency(GatewayError):
    """The tenant has as many requests under way as its limit allows (this node's share)."""

    status, code, kind = 429, "tenant_concurrency", "rate_limit_error"
    title = "Too many requests under way at once"


# refusals the tenant's quotas and budgets count themselves (agents/gateway/quotas.py)
TenantLimit = QuotaExceeded | TenantConcurrency | BudgetExceeded


class TenantShare(GatewayError):
    """The model's workers here are saturated and the tenant holds more than its fair share
    of them: others' requests go first."""

    status, code, kind = 429, "tenant_share", "rate_limit_error"
    title = "Over its fair share of a saturated model"


class QueueFull(GatewayError):
    status, code, kind, title = 429, "queue_full", "rate_limit_error", "Model is at capacity"


class ClassShed(GatewayError):
    """The model's queue was full, and a request of a higher service class took this one's
    place."""

    status, code, kind = 429, "class_shed", "rate_limit_error"
    title = "Shed for a higher service class"


class Overloaded(GatewayError):
    status, code, kind = 429, "overloaded", "rate_limit_error"
    title = "No worker can answer within the SLO"


class NoHealthyWorker(GatewayError):
    status, code, kind = 503, "no_healthy_worker", "service_unavailable"
    title = "No healthy worker for the model"


class Preempted(GatewayError):
    """A request of a higher service class took this one's place before its engine started
    it (the route's classes allow it): it was aborted there, and may be sent again."""

    status, code, kind = 503, "preempted", "service_unavailable"
    title = "Preempted by a higher service class"


class UpstreamFailed(GatewayError):
    status, code, kind, title = 502, "upstream_failed", "api_error", "The engine failed"


class ToolChoiceUnmet(GatewayError):
    """The request forced a tool call (`tool_choice` "required" or a named function) and the
    engine's whole answer, not cut by its length cap, made none, or called another: it is not
    passed off as an answer that meets the request."""

    status, code, kind = 502, "tool_choice_unmet", "api_error"
    title = "The answer did not make the tool call the request forced"


class EngineRefused(GatewayError):
    """The engine answered 4xx: its reason, in the gateway's shape (SGLang's own is not
    OpenAI's)."""

    code, kind, title = "engine_refused", "invalid_request_error", "The engine refused it"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"the engine refused the request: {message}"[:1024])
        self.status = status


class InternalError(GatewayError):
    """A fault of the gateway's own; the request id in the answer's header finds its log."""

    status, code, kind, title = 500, "internal_error", "api_error", "Internal error"

    def __init__(self) -> None:
        super().__init__("the gateway failed this request; it is logged under its request id")


class NotReady(GatewayError):
    status, code, kind, title = 503, "not_ready", "service_unavailable", "No snapshot yet"


REFUSALS: dict[Refusal, type[GatewayError]] = {
    Refusal.QUEUE_FULL: QueueFull,
    Refusal.OVERLOADED: Overloaded,
    Refusal.TENANT_SHARE: TenantShare,
    Refusal.NO_HEALTHY_WORKER: NoHealthyWorker,
    Refusal.UPSTREAM_FAILED: UpstreamFailed,
    Refusal.CLASS_SHED: ClassShed,
}


def refusal_error(reject: Reject) -> GatewayError:
    """The router's refusal, as the client is answered."""
    return REFUSALS[reject.code](reject.message, retry_after_s=reject.retry_after_s)
