"""`GET /metrics` of an agent after traffic: Prometheus text that prometheus_client's parser
reads, with the GenAI server histograms and Meridian's families."""

from __future__ import annotations

from pathlib import Path

import httpx
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.kits.fleet import LLAMA, OPERATOR, Fleet, fleet_of
from tests.kits.push import ADMIN

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


async def _scrape(fleet: Fleet, region: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name: (labels, value)."""
    async with httpx.AsyncClient(timeout=10) as http:
        plain = await http.get(f"{fleet.agents[region].url}/metrics")
        answer = await http.get(
            f"{fleet.agents[region].url}/metrics",
            headers={"Authorization": f"Bearer {OPERATOR}"},
        )
    assert plain.status_code == 401  # it names tenants: behind the operator token
    assert answer.headers["Content-Type"].startswith("text/plain")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def _total(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    return sum(v for got, v in samples if all(got.get(k) == want for k, want in labels.items()))


async def test_an_agent_s_metrics_after_traffic_local_and_escalated(
    database_url: str, tmp_path: Path
) -> None:
    async with fleet_of(database_url, tmp_path, ("us-east", "us-west")) as fleet:
        west = fleet.client("us-west")
        for _ in range(3):
            stream = await west.chat.completions.create(
                model=LLAMA, messages=HELLO, max_tokens=8, stream=True
            )
            async for _chunk in stream:
                pass
            await west.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=8)
        await fleet.fail_engines("us-east")
        east = fleet.client("us-east")
        for _ in range(2):
            await east.chat.completions.create(model=LLAMA, messages=HELLO, max_tokens=4)
        here, there = await _scrape(fleet, "us-west"), await _scrape(fleet, "us-east")
        await west.close()
        await east.close()
    chat = {"gen_ai_operation_name": "chat", "gen_ai_request_model": LLAMA}
    assert _total(here["gen_ai_server_time_to_first_token_seconds_count"], **chat) == 3
    assert _total(here["gen_ai_server_time_per_output_token_seconds_count"], **chat) == 3
    assert _total(here["gen_ai_server_request_duration_seconds_count"], **chat) == 8  # 2 came
    buckets = [s for s in here["gen_ai_server_time_to_first_token_seconds_bucket"]]
    assert {labels["le"] for labels, _ in buckets} >= {"0.001", "0.1", "10.0", "+Inf"}
    local = _total(here["meridian_requests_total"], region="us-west", status="200",
                   tenant="acme")  # fmt: skip
    assert local == 8
    assert _total(here["meridian_escalations_total"], direction="in", peer="us-east") == 2
    assert _total(here["meridian_prompt_tokens_total"], source="engine", kind="prompt") > 0
    assert _total(here["meridian_routing_decisions_total"], policy="cost") == 8
    assert here["meridian_snapshot_revision"][0][1] >= 1
    # us-east: its engine failed them, and a peer answered
    assert _total(there["meridian_requests_total"], worker="peer:us-west", status="200") == 2
    assert _total(there["meridian_escalations_total"], direction="out", peer="us-west",
                  reason="failure") == 2  # fmt: skip
    assert _total(there["meridian_circuit_breaker_state"], kind="peer", target="us-west",
                  state="closed") == 1  # fmt: skip


async def test_the_control_plane_s_metrics_count_agents_acks_and_its_api(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        fleet_of(database_url, tmp_path, ("us-east", "us-west")) as fleet,
        httpx.AsyncClient(base_url=fleet.cp.url, timeout=10) as http,
    ):
        anonymous = await http.get("/metrics")
        await http.get("/v1/regions/us-west", headers=ADMIN)
        await http.get("/v1/regions/atlantis", headers=ADMIN)
        text = (await http.get("/metrics", headers=ADMIN)).text
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    assert anonymous.status_code == 401
    assert _total(samples["meridian_agents_connected"], region="us-west") == 1
    assert _total(samples["meridian_agents_connected"], region="us-east") == 1
    assert _total(samples["meridian_snapshot_acks_total"], region="us-west") >= 1
    assert _total(samples["meridian_push_ack_seconds_count"], region="us-east") >= 1
    api = samples["http_server_request_duration_seconds_count"]
    route = {"http_route": "/v1/regions/{name}", "http_request_method": "GET"}
    assert _total(api, http_response_status_code="200", **route) == 1
    assert _total(api, http_response_status_code="404", **route) == 1
    assert _total(api, http_route="/v1/apply", http_response_status_code="200") == 1
