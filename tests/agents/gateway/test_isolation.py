"""What one tenant does never reaches another's requests: a client's X-Request-ID is its to
choose, so two tenants may choose the same, and one leaving (which aborts its engine request
by id) must not abort the other's."""

from __future__ import annotations

import asyncio

import httpx

from tests.agents.gateway.inproc import KEY, MODEL, OTHER_KEY, local_gateway, region_config
from tests.agents.sim_kit import running_sim, sse


def _stream(tokens: int) -> dict[str, object]:
    return {"model": MODEL, "stream": True, "max_tokens": tokens,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "tell me a long story"}]}  # fmt: skip


async def test_a_tenant_leaving_under_anothers_request_id_aborts_only_its_own() -> None:
    async with (
        running_sim("--speed-factor", "0.2", model=MODEL) as sim,
        local_gateway(region_config("r", [sim.url])) as region,
        httpx.AsyncClient(base_url=region.url, timeout=60) as http,
    ):
        same = {"X-Request-ID": "order-42"}
        victim = asyncio.create_task(http.post(
            "/v1/chat/completions", json=_stream(60),
            headers={**same, "Authorization": f"Bearer {OTHER_KEY}"},
        ))  # fmt: skip
        await asyncio.sleep(0.3)  # the victim's request is generating
        headers = {**same, "Authorization": f"Bearer {KEY}"}
        async with http.stream("POST", "/v1/chat/completions", json=_stream(60),
                               headers=headers) as leaving:  # fmt: skip
            async for _ in leaving.aiter_bytes():
                break  # the first bytes, and gone: the gateway aborts its engine request
        answer = await victim
    assert answer.status_code == 200
    assert answer.headers["x-request-id"] == "order-42"
    events = await sse(answer)
    assert events[-1] == "[DONE]"
    usage = next(e["usage"] for e in reversed(events) if isinstance(e, dict) and e.get("usage"))
    assert usage["completion_tokens"] == 60
