"""A request's service class at the gateway, over a real simulated engine: named by OpenAI's
service_tier or x-meridian-class, clamped to the tenant's ceiling, said in the answer; a
value that is no class is a 400 that changes nothing."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import replace
from typing import Any

import httpx
from meridian_pb.fleet.v1.classes import ServiceClass

from tests.kits.inproc import (
    KEY,
    MODEL,
    OPERATOR,
    OTHER,
    OTHER_KEY,
    local_gateway,
    region_config,
)
from tests.kits.sim import running_sim


def _body(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            **extra}  # fmt: skip


async def test_a_request_names_its_class_and_is_clamped_to_its_tenants_ceiling() -> None:
    """acme has the defaults (standard, and no higher); beta may ask for interactive."""
    beta = replace(OTHER, class_ceiling=ServiceClass.INTERACTIVE)
    async with AsyncExitStack() as stack:
        sim = await stack.enter_async_context(running_sim(model=MODEL))
        config = region_config("r", [sim.url])
        keys = {h: replace(k, tenant=beta) if k.tenant.name == beta.name else k
                for h, k in config.keys.items()}  # fmt: skip
        config = replace(config, keys=keys, tenants={**config.tenants, beta.name: beta})
        region = await stack.enter_async_context(local_gateway(config))
        async with httpx.AsyncClient(base_url=region.url, timeout=30) as client:

            async def served(key: str = KEY, header: str | None = None, **extra: Any) -> str:
                headers = {"Authorization": f"Bearer {key}"}
                if header is not None:
                    headers["x-meridian-class"] = header
                answer = await client.post("/v1/chat/completions", json=_body(**extra),
                                           headers=headers)  # fmt: skip
                assert answer.status_code == 200, answer.text
                served = answer.headers["x-meridian-class"]
                tier = {"interactive": "priority", "standard": "default"}.get(served, served)
                assert answer.headers["x-meridian-service-tier"] == tier
                return served

            assert await served() == "standard"  # none named: the tenant's default
            assert await served(service_tier="auto") == "standard"
            assert await served(service_tier="flex") == "flex"
            assert await served(service_tier="priority") == "standard"  # above its ceiling
            assert await served(header="interactive") == "standard"
            assert await served(header="batch") == "batch"
            assert await served(header="batch", service_tier="flex") == "batch"  # the lower
            assert await served(OTHER_KEY, service_tier="priority") == "interactive"
            assert await served(OTHER_KEY) == "standard"
            assert await served(OPERATOR, header="interactive") == "interactive"
            for header, extra, param in (
                ("gold", {}, "x-meridian-class"),
                (None, {"service_tier": "scale-up"}, "service_tier"),
            ):
                headers = {"Authorization": f"Bearer {KEY}"}
                if header is not None:
                    headers["x-meridian-class"] = header
                refused = await client.post("/v1/chat/completions", json=_body(**extra),
                                            headers=headers)  # fmt: skip
                assert refused.status_code == 400, refused.text
                assert refused.json()["error"]["param"] == param
            assert region.idle()
