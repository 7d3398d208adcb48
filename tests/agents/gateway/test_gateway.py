"""The region's OpenAI endpoint on the agent's port, as a client sees it: the official `openai`
client, streamed and not; keys, revocation and quotas from the snapshot alone; a client that
goes away; a full queue; and serving on with the control plane gone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.engines import metrics as engine_metrics
from meridian.procs import stop_child
from tests.kits.gateway import OPERATOR, region_of, sim_load
from tests.kits.push import eventually

LLAMA = "llama-3.1-8b-instruct"
QWEN = "qwen2.5-32b-instruct"


async def test_the_openai_client_works_unchanged_streamed_and_not(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "us-east", engines=3) as region:
        key = await region.api_key("acme")
        await region.applied()
        client = openai.AsyncOpenAI(base_url=region.base_url, api_key=key, max_retries=0)
        models = await client.models.list()
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA,
            messages=[{"role": "user", "content": "say something"}],
            max_tokens=5,
            extra_headers={"X-Request-ID": "req-from-the-client"},
        )
        answer = raw.parse()
        stream = await client.chat.completions.create(
            model=LLAMA, messages=[{"role": "user", "content": "count"}], max_tokens=6, stream=True
        )
        chunks = [chunk async for chunk in stream]
        with_usage = await client.chat.completions.create(
            model=LLAMA,
            messages=[{"role": "user", "content": "count"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        last = [chunk async for chunk in with_usage][-1]
        completion = await client.completions.create(model=QWEN, prompt="once upon", max_tokens=4)
        async with httpx.AsyncClient(timeout=10) as http:
            native = await http.post(
                f"{region.agent.url}/generate",
                json={"model": LLAMA, "text": "hi", "sampling_params": {"max_new_tokens": 3}},
                headers={"Authorization": f"Bearer {key}"},
            )
        await client.close()
    assert sorted(m.id for m in models.data) == ["chat-auto", LLAMA, QWEN]  # chat-auto: tiered
    assert raw.headers["x-request-id"] == "req-from-the-client"
    assert raw.headers["x-meridian-region"] == "us-east"
    assert "x-meridian-route" not in raw.headers  # tenants never see worker names
    assert answer.choices[0].message.content
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 5
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 6
    assert all(c.usage is None for c in chunks)  # the usage chunk only when asked for
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 3
    assert completion.choices[0].text
    assert completion.model == QWEN
    assert native.status_code == 200
    assert native.json()["meta_info"]["completion_tokens"] == 3


async def test_bad_keys_unknown_models_and_missing_capabilities_get_openai_errors(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "us-east", engines=3) as region:
        key = await region.api_key("acme")
        eu_only = await region.api_key("eurobank")  # allowed in the eu jurisdiction only
        await region.applied()
        good = openai.AsyncOpenAI(base_url=region.base_url, api_key=key, max_retries=0)
        bad = openai.AsyncOpenAI(base_url=region.base_url, api_key="mk-nope.nope", max_retries=0)
        barred = openai.AsyncOpenAI(base_url=region.base_url, api_key=eu_only, max_retries=0)
        hello = [{"role": "user", "content": "hello"}]
        with pytest.raises(openai.AuthenticationError) as unauthenticated:
            await bad.chat.completions.create(model=LLAMA, messages=hello)  # type: ignore[arg-type]
        with pytest.raises(openai.PermissionDeniedError) as elsewhere:
            await barred.chat.completions.create(model=LLAMA, messages=hello)  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError) as unknown:
            await good.chat.completions.create(model="gpt-9", messages=hello)  # type: ignore[arg-type]
        tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
        with pytest.raises(openai.BadRequestError) as no_tools:
            await good.chat.completions.create(
                model=QWEN,
                messages=hello,  # type: ignore[arg-type]
                tools=[tool],  # type: ignore[list-item]
            )
        too_long = [{"role": "user", "content": "word " * 40_000}]
        with pytest.raises(openai.BadRequestError) as long_prompt:
            await good.chat.completions.create(model=QWEN, messages=too_long)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as negative:
            await good.chat.completions.create(model=QWEN, messages=hello, max_tokens=-5)  # type: ignore[arg-type]
        await good.close()
        await bad.close()
        await barred.close()
        async with httpx.AsyncClient(timeout=10) as http:
            metrics = await http.get(f"{region.agent.url}/metrics", headers=region.agent_headers)
            status = await http.get(
                f"{region.agent.url}/agent/status", headers=region.agent_headers
            )
    assert unauthenticated.value.status_code == 401
    assert unauthenticated.value.code == "invalid_api_key"
    assert elsewhere.value.status_code == 403
    assert elsewhere.value.code == "forbidden"
    assert unknown.value.code == "model_not_found"
    assert no_tools.value.code == "capability_unsupported"
    assert long_prompt.value.code == "context_length_exceeded"
    assert negative.value.param == "max_tokens"
    # none of them was routed to an engine (the engines' own load is no witness: the quality
    # guard's canaries reach them in the background)
    routed = [
        sample
        for family in text_string_to_metric_families(metrics.text)
        if family.name == "meridian_routing_decisions"
        for sample in family.samples
    ]
    assert metrics.status_code == 200
    assert routed == []
    assert status.status_code == 200  # loopback and no operator token: open


async def test_a_revoked_key_stops_working_with_the_next_snapshot(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "us-west", engines=1) as region:
        created = await region.admin("POST", "/v1/api-keys", {"tenant": "acme"})
        await region.applied()
        client = openai.AsyncOpenAI(base_url=region.base_url, api_key=created["key"], max_retries=0)
        hello = [{"role": "user", "content": "hello"}]
        before = await client.chat.completions.create(model=LLAMA, messages=hello, max_tokens=1)  # type: ignore[arg-type]
        await region.admin("PATCH", f"/v1/api-keys/{created['name']}", {"revoked": True})
        await region.applied()
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model=LLAMA, messages=hello, max_tokens=1)  # type: ignore[arg-type]
        await client.close()
    assert before.choices[0].message.content


async def test_a_tenant_over_its_quota_gets_429_with_retry_after_and_others_do_not(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "us-west", engines=1) as region:
        await region.admin("POST", "/v1/tenants", {"name": "tiny", "requests_per_minute": 2})
        tiny, acme = await region.api_key("tiny"), await region.api_key("acme")
        await region.applied()
        body = {"model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        url = f"{region.agent.url}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=10) as http:
            answers = [
                await http.post(url, json=body, headers={"Authorization": f"Bearer {tiny}"})
                for _ in range(3)
            ]
            others = [
                await http.post(url, json=body, headers={"Authorization": f"Bearer {acme}"})
                for _ in range(3)
            ]
    codes = [a.status_code for a in answers]
    assert codes[0] == 200
    assert 429 in codes
    refused = next(a for a in answers if a.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert [o.status_code for o in others] == [200, 200, 200]


async def test_a_client_that_goes_away_mid_stream_aborts_the_engine_request(
    database_url: str, tmp_path: Path
) -> None:
    # the engine's own load witnesses the request: no canary of the quality guard beside it
    quiet = {"MERIDIAN_AGENT_QUALITY_GUARD": "false"}
    async with region_of(database_url, tmp_path, "us-west", engines=1, agent_env=quiet) as region:
        key = await region.api_key("acme")
        await region.applied()
        engine = "http://127.0.0.2:30000"
        async with httpx.AsyncClient(timeout=10) as http:
            await http.post(f"{engine}/sim/faults", json={"slow_factor": 50})
            body = {
                "model": LLAMA,
                "messages": [{"role": "user", "content": "a long story"}],
                "max_tokens": 4000,
                "stream": True,
            }
            async with http.stream(
                "POST",
                f"{region.agent.url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                # the first event; the iterator is kept, since one let go is closed by the
                # garbage collector at once, and with it the connection: the client would have
                # left before the engine's load is read
                chunks = response.aiter_bytes()
                await anext(chunks)
                during = await sim_load(engine)
                await response.aclose()  # now the client leaves
            for _ in range(50):
                if await sim_load(engine) == 0:
                    break
                await asyncio.sleep(0.1)
            after = await sim_load(engine)
    assert response.status_code == 200
    assert during == 1
    assert after == 0  # the engine stopped working on it


async def test_past_the_queue_bound_the_answer_is_429_at_once(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "us-west", engines=1) as region:
        key = await region.api_key("acme")
        policy = {"name": "tight", "model": LLAMA, "region": "us-west", "policy": "least_load",
                  "max_inflight": 1, "max_queue": 1}  # fmt: skip
        await region.admin("POST", "/v1/routing-policies", policy)
        await region.applied()
        await _slow("http://127.0.0.2:30000")
        body = {"model": LLAMA, "messages": [{"role": "user", "content": "x"}], "max_tokens": 200}
        url = f"{region.agent.url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(timeout=30) as http:
            first = asyncio.create_task(http.post(url, json=body, headers=headers))
            await asyncio.sleep(0.3)
            second = asyncio.create_task(http.post(url, json=body, headers=headers))
            await asyncio.sleep(0.3)
            started = asyncio.get_running_loop().time()
            third = await http.post(url, json=body, headers=headers)
            waited = asyncio.get_running_loop().time() - started
            first.cancel()
            second.cancel()
            await asyncio.gather(first, second, return_exceptions=True)
    assert third.status_code == 429
    assert third.json()["code"] == "queue_full"
    assert int(third.headers["Retry-After"]) >= 1
    assert waited < 2  # at once, not after a wait


async def test_the_gateway_serves_on_with_the_control_plane_killed(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "us-west", engines=1) as region:
        await region.admin("POST", "/v1/tenants", {"name": "tiny", "requests_per_minute": 2})
        tiny, acme = await region.api_key("tiny"), await region.api_key("acme")
        await region.applied()
        region.cp.process.kill()
        await stop_child(region.cp.process)
        body = {"model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        url = f"{region.agent.url}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=10) as http:
            served = await http.post(url, json=body, headers={"Authorization": f"Bearer {acme}"})
            stranger = await http.post(url, json=body, headers={"Authorization": "Bearer mk-x.y"})
            tiny_answers = [
                (await http.post(url, json=body, headers={"Authorization": f"Bearer {tiny}"}))
                for _ in range(3)
            ]
            status = await region.agent.status()
    assert status["control_plane"]["connected"] is False
    assert served.status_code == 200
    assert stranger.status_code == 401
    assert 429 in [a.status_code for a in tiny_answers]


async def _slow(engine: str) -> None:
    async with httpx.AsyncClient(timeout=5) as http:
        await http.post(f"{engine}/sim/faults", json={"slow_factor": 30})


async def test_a_worker_killed_mid_traffic_is_ejected_retried_around_and_used_again(
    database_url: str, tmp_path: Path
) -> None:
    async with region_of(database_url, tmp_path, "eu-west", engines=2) as region:
        key = await region.api_key("acme")
        status = await region.applied()
        victim = sorted(e["url"] for e in status["engines"])[0]
        url = f"{region.agent.url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {key}"}
        codes: list[int] = []

        async def traffic(http: httpx.AsyncClient, seconds: float, n: int) -> None:
            loop = asyncio.get_running_loop()
            end = loop.time() + seconds
            while loop.time() < end:
                prompt = f"question {n} {len(codes)}"
                body = {"model": LLAMA, "max_tokens": 30,
                        "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
                codes.append((await http.post(url, json=body, headers=headers)).status_code)

        async with httpx.AsyncClient(timeout=30) as http:
            clients = [asyncio.create_task(traffic(http, 4, n)) for n in range(6)]
            await asyncio.sleep(1)
            await http.post(f"{victim}/sim/faults", json={"crash": True})
            await asyncio.gather(*clients)

            async def restarted() -> bool:
                engines = (await region.agent.status())["engines"]
                again = next(e for e in engines if e["url"] == victim)
                return bool(again["state"] == "ready" and again["restarts"] >= 1)

            await eventually(restarted, within_s=20)
            await asyncio.sleep(2.5)  # the breaker's cooldown, then its probe
            await asyncio.gather(*(traffic(http, 3, n) for n in range(6)))
            metrics = (await http.get(f"{victim}/metrics")).text
    assert codes
    assert set(codes) == {200}
    assert engine_metrics.parse(metrics).requests > 0  # served again


async def test_the_operator_and_marked_tenants_see_the_route_and_only_the_operator_reads_status(
    database_url: str, tmp_path: Path
) -> None:
    operator = OPERATOR
    async with region_of(database_url, tmp_path, "eu-west", engines=2, token=operator) as region:
        key = await region.api_key("acme")
        marked = await region.api_key("eurobank")
        await region.admin("PATCH", "/v1/tenants/eurobank", {"debug_routes": True})
        await region.applied()
        body = {"model": LLAMA, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        url = f"{region.agent.url}/v1/chat/completions"
        debug = {"x-meridian-debug": "1"}
        async with httpx.AsyncClient(timeout=10) as http:
            as_operator = await http.post(
                url, json=body, headers={"Authorization": f"Bearer {operator}", **debug}
            )
            as_tenant = await http.post(
                url, json=body, headers={"Authorization": f"Bearer {key}", **debug}
            )
            as_marked = await http.post(
                url, json=body, headers={"Authorization": f"Bearer {marked}", **debug}
            )
            marked_not_asking = await http.post(
                url, json=body, headers={"Authorization": f"Bearer {marked}"}
            )
            status_open = await http.get(f"{region.agent.url}/agent/status")
            status_marked = await http.get(
                f"{region.agent.url}/agent/status", headers={"Authorization": f"Bearer {marked}"}
            )
            decisions = await http.get(
                f"{region.agent.url}/agent/decisions?limit=10",
                headers={"Authorization": f"Bearer {operator}"},
            )
            decisions_open = await http.get(f"{region.agent.url}/agent/decisions")
    assert as_operator.status_code == 200
    route = json.loads(as_operator.headers["x-meridian-route"])
    assert route["policy"] == "cost"
    assert route["worker"].startswith("llama-eu-west/unified-")
    assert route["reason"].startswith("cheapest predicted ttft")
    assert {c["worker"] for c in route["candidates"]} == {
        "llama-eu-west/unified-0",
        "llama-eu-west/unified-1",
    }
    assert as_tenant.status_code == 200
    assert "x-meridian-route" not in as_tenant.headers
    # A tenant the snapshot marks sees its routes when it asks, and nothing else inside.
    assert as_marked.status_code == 200
    assert json.loads(as_marked.headers["x-meridian-route"])["policy"] == "cost"
    assert "x-meridian-route" not in marked_not_asking.headers
    assert status_open.status_code == 401
    assert status_marked.status_code == 401
    # Every decision is kept with its reason; the operator reads the latest.
    assert decisions.status_code == 200
    recorded = {d["request_id"]: d for d in decisions.json()}
    assert len(recorded) == 4
    mine = recorded[as_operator.headers["X-Request-ID"]]
    assert mine["model"] == LLAMA
    assert mine["worker"] == route["worker"]
    assert mine["reason"].startswith("cheapest predicted ttft")
    assert decisions_open.status_code == 401


async def test_a_disaggregated_deployment_answers_through_its_pair_and_prefills_short_ones_here(
    database_url: str, tmp_path: Path
) -> None:
    operator = OPERATOR
    async with region_of(database_url, tmp_path, "eu-west", engines=2, token=operator) as region:
        pd = {"pd_mode": "disaggregated", "prefill_replicas": 1, "decode_replicas": 1}
        await region.admin("PATCH", "/v1/deployments/llama-eu-west", pd)

        async def paired() -> dict[str, str] | None:
            engines = (await region.agent.status())["engines"]
            roles = {e["role"]: e["url"] for e in engines if e["state"] == "ready"}
            return roles if {"prefill", "decode"} <= set(roles) else None

        roles = await eventually(paired, within_s=40)
        url = f"{region.agent.url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {operator}", "x-meridian-debug": "1"}
        long_prompt = " ".join(f"word{i}" for i in range(3000))
        answers = []
        async with httpx.AsyncClient(timeout=30) as http:
            # new and long: disaggregated; short: local; the long one's prefix again: the
            # decode worker holds it since the hand-over, so local
            for content in (long_prompt, "hi", long_prompt + " and a follow-up"):
                body = {"model": LLAMA, "max_tokens": 4,
                        "messages": [{"role": "user", "content": content}]}  # fmt: skip
                answers.append(await http.post(url, json=body, headers=headers))
            streamed = await http.post(
                url, json={**body, "stream": True, "messages": [
                    {"role": "user", "content": "streamed " + long_prompt}]},
                headers=headers,
            )  # fmt: skip
            prefill_metrics = (await http.get(f"{roles['prefill']}/metrics")).text
            status = await region.agent.status()
    long, short, follow_up = answers
    assert long.status_code == 200, long.text
    assert long.json()["usage"]["completion_tokens"] == 4
    route = json.loads(long.headers["x-meridian-route"])
    assert route["pd"] == "disaggregated"
    assert route["worker"].startswith("llama-eu-west/decode-")
    assert route["prefill_worker"].startswith("llama-eu-west/prefill-")
    assert short.status_code == 200, short.text
    assert json.loads(short.headers["x-meridian-route"])["pd"] == "local"
    assert follow_up.status_code == 200, follow_up.text
    assert json.loads(follow_up.headers["x-meridian-route"])["pd"] == "local"
    assert streamed.status_code == 200
    assert streamed.text.rstrip().endswith("data: [DONE]")
    assert json.loads(streamed.headers["x-meridian-route"])["pd"] == "disaggregated"
    # The prefill engine computed the two long prompts, and nothing else.
    assert engine_metrics.parse(prefill_metrics).requests == 2
    assert status["router"]["pd_choices"] == {"disaggregated": 2, "local": 2}


async def test_kv_cache_events_keep_the_router_index_exact(
    database_url: str, tmp_path: Path
) -> None:
    operator = OPERATOR
    async with region_of(database_url, tmp_path, "eu-west", engines=2, token=operator) as region:
        await region.admin(
            "PATCH", "/v1/routing-policies/llama-eu-west", {"params": {"kv_events": True}}
        )

        async def subscribed() -> dict[str, Any] | None:
            status = await region.agent.status()
            ready = [e for e in status["engines"] if e["state"] == "ready"]
            subscriptions = status["router"]["kv_events"]
            return status if len(ready) == 2 and len(subscriptions) == 2 else None

        await eventually(subscribed, within_s=40)
        url = f"{region.agent.url}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {operator}", "x-meridian-debug": "1"}
        body = {"model": LLAMA, "max_tokens": 2, "messages": [
            {"role": "user", "content": " ".join(f"w{i}" for i in range(300))}]}  # fmt: skip

        async def send(http: httpx.AsyncClient) -> tuple[dict[str, Any], int]:
            answer = await http.post(url, json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            route = json.loads(answer.headers["x-meridian-route"])
            return route, int(answer.json()["usage"]["prompt_tokens"])

        def matched(route: dict[str, Any]) -> int:
            chosen = next(c for c in route["candidates"] if c["worker"] == route["worker"])
            return int(chosen["matched_tokens"])

        async with httpx.AsyncClient(timeout=30) as http:
            # the engines restarted to publish; events flow once each subscriber has joined
            warm = {"model": LLAMA, "max_tokens": 2, "messages": [
                {"role": "user", "content": " ".join(f"x{i}" for i in range(64))}]}  # fmt: skip

            async def flowing() -> bool:
                status = await region.agent.status()
                for engine in status["engines"]:  # straight to each engine: it publishes
                    answer = await http.post(f"{engine['url']}/v1/chat/completions", json=warm)
                    assert answer.status_code == 200, answer.text
                    await http.post(f"{engine['url']}/flush_cache")
                events = (await region.agent.status())["router"]["kv_events"]
                return len(events) == 2 and all(count > 0 for count in events.values())

            await eventually(flowing, within_s=30, every_s=0.5)
            first, prompt_tokens = await send(http)
            again, _ = await send(http)
            holder = next(e for e in (await region.agent.status())["engines"]
                          if e["id"] == first["worker"])  # fmt: skip
            await asyncio.sleep(0.3)  # the last events land
            events_before = (await region.agent.status())["router"]["kv_events"][holder["id"]]

            async def flushed() -> bool:  # refused (400) while a canary runs there, as SGLang
                return (await http.post(f"{holder['url']}/flush_cache")).status_code == 200

            await eventually(flushed, within_s=15, every_s=0.2)

            async def cleared() -> bool:
                events = (await region.agent.status())["router"]["kv_events"][holder["id"]]
                return bool(events > events_before)

            await eventually(cleared, within_s=10)
            after, _ = await send(http)
    assert matched(first) == 0
    # The same prompt again goes where it is held, matched token for token.
    assert again["worker"] == first["worker"]
    assert matched(again) == prompt_tokens
    # The engine dropped its cache and said so: the router no longer counts on it.
    held = [c for c in after["candidates"] if c["worker"] == first["worker"]]
    assert held
    assert held[0]["matched_tokens"] == 0
