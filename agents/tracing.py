"""Traces of the gateway's requests, with OpenTelemetry: off unless an OTLP endpoint is set
(OTEL_EXPORTER_OTLP_ENDPOINT, or MERIDIAN_AGENT_TRACE_ENDPOINT), and nothing on a request's
path then but one `is None` test.

A server span per request, named and attributed by the GenAI conventions (`{operation}
{model}`; `gen_ai.operation.name`, `gen_ai.request.model`, `gen_ai.usage.input_tokens`,
`gen_ai.usage.output_tokens`, `gen_ai.usage.cache_read.input_tokens`,
`gen_ai.response.time_to_first_chunk`, `error.type`), with Meridian's own for the decision
(`meridian.*`: region, policy, worker, the top candidates' predicted TTFT, matched prefix
tokens, PD choice, escalation and why). The W3C trace context comes from the client, and the
span's own goes to the engine and to a peer region, so one trace shows a request across an
escalation. Sampling: a ratio (`trace_sample`, 1.0 by default), parent-based, so a region
that receives an escalated request follows the sending region's choice. A trace this gateway
starts and does not keep costs one random number: no span is made for it. Spans leave through a
batch processor on its own thread.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    def __init__(self, endpoint: str, sample: float, region: str, node: str) -> None:
        resource = Resource.create(
            {"service.name": "meridian-agent", "meridian.region": region, "meridian.node": node}
        )
        self.sample = sample
        self.provider = TracerProvider(
            resource=resource, sampler=ParentBased(TraceIdRatioBased(sample))
        )
        traces = endpoint.rstrip("/")
        if not traces.endswith("/v1/traces"):
            traces += "/v1/traces"
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces)))
        self.tracer = self.provider.get_tracer("meridian.gateway")

    def start(self, name: str, headers: Mapping[str, str], start_ns: int) -> Span | None:
        """The request's server span, a child of the client's trace context if it sent one;
        None for a trace this gateway starts and does not keep (most, at a small ratio): the
        SDK's span that records nothing would cost as much as a tenth of the request's CPU."""
        if "traceparent" not in headers and random.random() >= self.sample:
            return None
        parent: Context = PROPAGATOR.extract(headers)
        return self.tracer.start_span(name, parent, SpanKind.SERVER, start_time=start_ns)

    @staticmethod
    def unkept_headers() -> bytes:
        """A `traceparent` of a new trace that is not kept, for a peer region, which then does
        not keep it either (its sampling is parent-based)."""
        trace_id, span_id = random.getrandbits(128) or 1, random.getrandbits(64) or 1
        return f"traceparent: 00-{trace_id:032x}-{span_id:016x}-00\r\n".encode()

    def shutdown(self) -> None:
        self.provider.shutdown()


def context_headers(span: Span) -> bytes:
    """`traceparent` (and `tracestate`) header lines of the span, for the engine or a peer."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, set_span_in_context(span))
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in carrier.items())


def finish(span: Span, attributes: dict[str, Any], error: str | None, end_ns: int) -> None:
    span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    if error is not None:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end_time=end_ns)
