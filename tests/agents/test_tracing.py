"""The gateway's tracing decisions that need no collector (tests/fleet/test_tracing.py has the
spans exported across an escalation)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.trace import get_current_span

from agents.tracing import PROPAGATOR, Tracing

KEPT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    # Nothing is exported: the batch processor sends only what is kept, and only later.
    made = Tracing("http://127.0.0.1:9/v1/traces", 0.0, "us-east", "us-east-1")
    yield made
    made.shutdown()


def test_a_trace_the_gateway_starts_and_does_not_keep_makes_no_span(tracing: Tracing) -> None:
    assert all(tracing.start("chat", {}, 0) is None for _ in range(100))


def test_a_clients_kept_trace_is_followed_whatever_the_ratio(tracing: Tracing) -> None:
    span = tracing.start("chat", {"traceparent": KEPT}, 0)
    assert span is not None
    assert span.is_recording()
    assert f"{span.get_span_context().trace_id:032x}" == KEPT.split("-")[1]


def test_a_peer_is_told_that_an_unkept_trace_is_not_kept(tracing: Tracing) -> None:
    first, second = Tracing.unkept_headers(), Tracing.unkept_headers()
    assert first != second  # a new trace each time
    name, _, value = first.decode().strip().partition(": ")
    assert name == "traceparent"
    context = get_current_span(PROPAGATOR.extract({"traceparent": value})).get_span_context()
    assert context.is_valid
    assert not context.trace_flags.sampled
    peer = tracing.start("chat", {"traceparent": value}, 0)  # parent-based: not kept there
    assert peer is not None
    assert not peer.is_recording()
