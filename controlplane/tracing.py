"""Traces of the control plane, with OpenTelemetry: off unless an OTLP endpoint is set
(MERIDIAN_TRACE_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT).

- a server span per admin API request (`GET /v1/regions/{name}`), a child of the caller's
  W3C trace context, with the method, route template and status;
- a span per compile of a revision (`compile revision N`: the revision, the regions whose
  snapshot changed, how long), and under it a span per snapshot sent to an agent (`push
  revision N`: region, node), so that one trace shows a change reaching the fleet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Tracer
from opentelemetry.trace import set_span_in_context as in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import Response

from controlplane.settings import Settings

PROPAGATOR = TraceContextTextMapPropagator()


def make_tracer(settings: Settings, replica: str) -> tuple[Tracer, TracerProvider] | None:
    endpoint = settings.trace_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return None
    resource = Resource.create(
        {"service.name": "meridian-controlplane", "meridian.replica": replica}
    )
    provider = TracerProvider(
        resource=resource, sampler=ParentBased(TraceIdRatioBased(settings.trace_sample))
    )
    traces = endpoint.rstrip("/")
    if not traces.endswith("/v1/traces"):
        traces += "/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces)))
    return provider.get_tracer("meridian.controlplane"), provider


def api_middleware(
    tracer: Tracer,
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def traced(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        parent = PROPAGATOR.extract(dict(request.headers))
        span = tracer.start_span(request.method, parent, SpanKind.SERVER, start_time=time.time_ns())
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = getattr(request.scope.get("route"), "path", None)
            if route:
                span.update_name(f"{request.method} {route}")
            span.set_attributes(
                {
                    "http.request.method": request.method,
                    "http.route": route or "",
                    "http.response.status_code": status,
                }
            )
            span.end()

    return traced


def child_of(context: SpanContext | None) -> Context | None:
    """A context whose current span is the one `context` names (for a span started later)."""
    return in_context(NonRecordingSpan(context)) if context is not None else None
