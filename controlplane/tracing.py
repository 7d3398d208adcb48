"""Traces of the control plane, with OpenTelemetry: off unless an OTLP endpoint is set
(MERIDIAN_TRACE_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT).

- a server span per admin API request (`GET /v1/regions/{name}`), a child of the caller's
  W3C trace context, with the method, route template and status (made by the middleware
  that times requests, `controlplane/metrics.py`);
- a span per compile of a revision (`compile revision N`: the revision, the regions whose
  snapshot changed, how long), and under it a span per snapshot sent to an agent (`push
  revision N`: region, node), so that one trace shows a change reaching the fleet.
"""

from __future__ import annotations

import os

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, Tracer
from opentelemetry.trace import set_span_in_context as in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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


def child_of(context: SpanContext | None) -> Context | None:
    """A context whose current span is the one `context` names (for a span started later)."""
    return in_context(NonRecordingSpan(context)) if context is not None else None
