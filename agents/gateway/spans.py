"""What a request's trace span says once it is answered: the GenAI conventions' attributes and
Meridian's own of the routing decision (agents/tracing.py makes and exports the spans)."""

from __future__ import annotations

import time
from typing import Any

from agents import tracing
from agents.metrics import OPERATIONS, Settled
from agents.router.decision import Decision
from agents.router.policies import Candidate


def finished(
    span: Any,
    path: str,
    status: int,
    served: Settled,
    started: float,
    error: str | None,
    region: str | None,
) -> None:
    operation = OPERATIONS.get(path, "chat")
    if served.model:
        span.update_name(f"{operation} {served.model}")
    first = served.first_at - started if served.first_at is not None else None
    tracing.finish(span, {
        "gen_ai.operation.name": operation, "gen_ai.request.model": served.model or None,
        "gen_ai.usage.input_tokens": served.prompt_tokens,
        "gen_ai.usage.output_tokens": served.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": served.cached_tokens,
        "gen_ai.response.time_to_first_chunk": first,
        "http.response.status_code": status,
        "meridian.region": region,
        "meridian.tenant": served.tenant or None, "meridian.worker": served.worker or None,
        **(served.decision or {}),
    }, error, time.time_ns())  # fmt: skip


def peer_context(span: Any, tracer: tracing.Tracing | None) -> bytes:
    """The trace context a peer region gets: the span's, or one saying it is not kept."""
    if span is not None:
        return tracing.context_headers(span)
    return tracer.unkept_headers() if tracer is not None else b""


def decision_attributes(decision: Decision, chosen: Candidate) -> dict[str, object]:
    top = decision.ranked[:3]
    return {
        "meridian.escalated": False,
        "meridian.policy": decision.policy,
        "meridian.reason": decision.reason,
        "meridian.prefix.matched_tokens": chosen.matched_tokens,
        "meridian.pd": decision.pd or "unified",
        "meridian.candidates": [c.worker.id for c in top],
        "meridian.candidates.predicted_ttft_ms": [round(c.ttft_s * 1000, 1) for c in top],
    }
