"""Traces of an escalated request: a fake OTLP collector (it decodes the real OTLP/HTTP
protobuf) receives the server spans of both regions' gateways, in one trace, with the
decision's attributes."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from meridian.procs import free_port
from tests.kits.fleet import LLAMA, fleet_of
from tests.kits.push import ADMIN, eventually

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
ADMIN_TRACE = "5bf92f3577b34da6a3ce929d0e0e4737"


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@pytest_asyncio.fixture(loop_scope="session")
async def collector(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[dict[str, Any]]]:
    """Spans as they arrive: ids in hex, the resource's region, the attributes."""
    spans: list[dict[str, Any]] = []

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    spans.append({
                        "trace": span.trace_id.hex(), "span": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(), "name": span.name,
                        "region": resource.get("meridian.region"),
                        "service": resource.get("service.name"),
                        "attributes": {a.key: _value(a.value) for a in span.attributes},
                    })  # fmt: skip
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    try:
        yield spans
    finally:
        await runner.cleanup()


async def test_one_trace_follows_a_request_across_regions_and_a_change_to_the_fleet(
    database_url: str, tmp_path: Path, collector: list[dict[str, Any]]
) -> None:
    assert os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    async with fleet_of(database_url, tmp_path, ("us-east", "us-west")) as fleet:
        await fleet.fail_engines("us-east")
        body = {"model": LLAMA, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(
                f"{fleet.agents['us-east'].url}/v1/chat/completions", json=body,
                headers={"Authorization": f"Bearer {fleet.keys['acme']}",
                         "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
            )  # fmt: skip

        async def both() -> dict[str, dict[str, Any]] | None:
            mine = {s["region"]: s for s in collector if s["trace"] == CLIENT_TRACE}
            return mine if {"us-east", "us-west"} <= set(mine) else None

        spans = await eventually(both, within_s=15)
        # a change through the admin API: its request, the compile, the send to each agent
        async with httpx.AsyncClient(base_url=fleet.cp.url, timeout=30) as http:
            changed = await http.patch(
                "/v1/tenants/acme", json={"requests_per_minute": 7000},
                headers={**ADMIN, "If-Match": "*",
                         "traceparent": f"00-{ADMIN_TRACE}-{CLIENT_SPAN}-01"},
            )  # fmt: skip
            revision = (await http.get("/v1/revision", headers=ADMIN)).json()["revision"]

        async def pushed() -> list[dict[str, Any]] | None:
            cp = [s for s in collector if s["service"] == "meridian-controlplane"]
            compiled = [s for s in cp if s["name"].startswith("compile revision")]
            sends = [s for s in cp if s["name"] == f"push revision {revision}"
                     and s["parent"] in {c["span"] for c in compiled}]  # fmt: skip
            regions = {s["attributes"]["meridian.region"] for s in sends}
            api = [s for s in cp if s["trace"] == ADMIN_TRACE]
            return cp if {"us-east", "us-west"} <= regions and api else None

        control = await eventually(pushed, within_s=15)
    api = [s for s in control if s["trace"] == ADMIN_TRACE]
    assert changed.status_code == 200
    assert [s["name"] for s in api] == ["PATCH /v1/tenants/{name}"]
    assert api[0]["parent"] == CLIENT_SPAN
    assert api[0]["attributes"]["http.response.status_code"] == 200
    east, west = spans["us-east"], spans["us-west"]
    assert answer.status_code == 200
    assert answer.headers["x-meridian-region"] == "us-west"
    assert east["parent"] == CLIENT_SPAN  # the client's context, taken
    assert west["parent"] == east["span"]  # and the peer's span is a child of the sender's
    assert east["name"] == west["name"] == f"chat {LLAMA}"
    assert east["attributes"]["meridian.escalated"] is True
    assert east["attributes"]["meridian.escalation.reason"] == "failure"
    assert east["attributes"]["meridian.peer"] == "us-west"
    assert west["attributes"]["meridian.policy"] == "cost"
    assert west["attributes"]["meridian.worker"].startswith("llama-us-west/")
    assert west["attributes"]["gen_ai.request.model"] == LLAMA
    assert west["attributes"]["gen_ai.usage.output_tokens"] == 4
    assert len(west["attributes"]["meridian.candidates.predicted_ttft_ms"]) >= 1
