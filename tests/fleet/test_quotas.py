"""Global quotas on a fleet of real processes: three regions, two agents in us-east, a tenant
of 600 requests a minute. Its shares follow its traffic within seconds (the adaptation time
is 10 s), the fleet admits within 5% of the quota, the leases hold while the control plane
is down and the static shares take over after their expiry; a tenant bound to the EU gets
leases only there; tokens per minute are counted by usage.

Admissions are counted by the client over windows after the adaptation time; a window of T
seconds may hold what the buckets held at its start (2 s of each agent's share) beyond the
quota's T/60 of a minute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import pytest_asyncio

from controlplane.db.embedded import Credentials
from tests.kits.agents import AgentProc, start_agent
from tests.kits.fleet import LLAMA, OPERATOR, Fleet, fleet_of
from tests.kits.push import ADMIN, bootstrap_token, eventually
from tests.kits.services import TEMPLATE, scratch_database

QUOTA = 600  # requests a minute: 10 a second
TOKENS = 30_000  # tokens a minute, for the tenant limited by tokens
ADAPT_S = 10.0
WINDOW_S = 8.0
BURST = 2 / 60  # of a minute: what a bucket holds


def _tenants(doc: dict[str, Any]) -> None:
    doc["tenants"] += [
        {"name": "paced", "tier": "standard", "requests_per_minute": QUOTA},
        {"name": "tokened", "tier": "standard", "tokens_per_minute": TOKENS},
    ]
    # us-east gets a second agent, on a node of its own without GPUs (its engines stay on
    # us-east-1; both agents' gateways route to them)
    doc["nodes"].append({"name": "us-east-2", "region": "us-east", "hostname": "127.0.0.4"})


@dataclass
class Quotas:
    fleet: Fleet
    gateways: dict[str, list[str]]  # region: its agents' URLs
    keys: dict[str, str]
    extra: AgentProc

    async def view(self, tenant: str) -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=self.fleet.cp.url, headers=ADMIN) as http:
            answer = await http.get(f"/v1/tenants/{tenant}/quota")
            assert answer.status_code == 200, answer.text
            view: dict[str, Any] = answer.json()
            return view


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def quotas(
    postgres: Credentials, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Quotas]:
    data = tmp_path_factory.mktemp("quotas")
    async with (
        scratch_database(postgres, "quotas", TEMPLATE) as url,
        fleet_of(url, data, change=_tenants) as fleet,
    ):
        async with httpx.AsyncClient(base_url=fleet.cp.url, headers=ADMIN) as http:
            keys = {}
            for tenant in ("paced", "tokened"):
                made = await http.post("/v1/api-keys", json={"tenant": tenant})
                keys[tenant] = made.json()["key"]
        token = await bootstrap_token(fleet.cp.url, "us-east")
        extra = await start_agent(fleet.cp.grpc_target, "us-east", data / "us-east-2",
                                  token=token, node="us-east-2", operator=OPERATOR)  # fmt: skip
        try:
            for region in fleet.agents:
                await fleet.speed_engines(region, 0.01)
            gateways = {r: [a.url] for r, a in fleet.agents.items()}
            gateways["us-east"].append(extra.url)
            ready = Quotas(fleet, gateways, keys | fleet.keys, extra)

            async def leased() -> bool:  # every agent takes part
                view = await ready.view("paced")
                return len(view["leases"]) == 4

            await eventually(leased, within_s=30)
            yield ready
        finally:
            await extra.stop()


@dataclass
class Sent:
    at: float
    region: str
    status: int
    tokens: int = 0
    headers: dict[str, str] = field(default_factory=dict)


async def _send(
    quotas: Quotas, tenant: str, rates: dict[str, float], seconds: float, *, prompt: str = "hi"
) -> list[Sent]:
    """Requests at a steady rate per region (spread over its agents) for `seconds`."""
    sent: list[Sent] = []
    body = {"model": LLAMA, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    headers = {"Authorization": f"Bearer {quotas.keys[tenant]}"}
    limits = httpx.Limits(max_connections=200)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:

        async def one(region: str, url: str) -> None:
            try:
                answer = await http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            except httpx.HTTPError:
                sent.append(Sent(time.monotonic(), region, 0))
                return
            used = answer.json().get("usage", {}).get("total_tokens", 0) if answer.is_success else 0
            sent.append(Sent(time.monotonic(), region, answer.status_code, used,
                             dict(answer.headers)))  # fmt: skip

        async def region_load(region: str, rate: float) -> None:
            urls, n, start = quotas.gateways[region], 0, time.monotonic()
            tasks = []
            while (due := start + n / rate) < start + seconds:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                tasks.append(asyncio.create_task(one(region, urls[n % len(urls)])))
                n += 1
            await asyncio.gather(*tasks)

        await asyncio.gather(*(region_load(r, rate) for r, rate in rates.items() if rate))
    return sent


def _admitted(sent: Sequence[Sent], since: float, until: float, region: str | None = None) -> int:
    return sum(1 for s in sent if since <= s.at < until and s.status == 200
               and (region is None or s.region == region))  # fmt: skip


def _bounds(seconds: float, share: float = 1.0) -> tuple[float, float]:
    """What a window may admit of `share` of the quota: 95% at least, at most 105% and what
    the buckets held at its start."""
    rate = QUOTA * share * seconds / 60
    return 0.95 * rate, 1.05 * rate + QUOTA * BURST


async def test_shares_follow_the_traffic_and_the_fleet_stays_within_the_quota(
    quotas: Quotas,
) -> None:
    twice = 2 * QUOTA / 60
    # everything into us-east (two agents) at twice the quota: us-east gets ~all of it
    started = time.monotonic()
    sent = await _send(quotas, "paced", {"us-east": twice}, ADAPT_S + WINDOW_S)
    since = started + ADAPT_S
    low, high = _bounds(WINDOW_S)
    assert low <= _admitted(sent, since, since + WINDOW_S) <= high
    # every answer says the limit and what is left of it, as OpenAI's do, so that a client
    # can pace itself before it is refused
    answered = next(s for s in sent if s.status == 200)
    assert answered.headers["x-ratelimit-limit-requests"] == str(QUOTA)
    assert 0 <= int(answered.headers["x-ratelimit-remaining-requests"]) <= QUOTA
    refused = next(s for s in sent if s.status == 429)
    assert refused.headers["x-ratelimit-limit-requests"] == str(QUOTA)
    assert int(refused.headers["x-ratelimit-remaining-requests"]) == 0
    assert refused.headers["x-ratelimit-reset-requests"].endswith("s")
    assert int(refused.headers["retry-after"]) >= 1

    # the traffic spreads evenly over the three regions: the shares follow, each about a
    # third, the whole within 5%
    started = time.monotonic()
    rates = dict.fromkeys(("us-east", "us-west", "eu-west"), twice / 3)
    sent = await _send(quotas, "paced", rates, ADAPT_S + WINDOW_S)
    since = started + ADAPT_S
    assert low <= _admitted(sent, since, since + WINDOW_S) <= high
    third_low, third_high = _bounds(WINDOW_S, 1 / 3)
    for region in rates:
        assert 0.9 * third_low <= _admitted(sent, since, since + WINDOW_S, region) <= third_high

    view = await quotas.view("paced")
    assert view["quota"]["requests_per_minute"] == QUOTA
    assert set(view["admitted"]["regions"]) == set(rates)
    assert view["refused_per_minute"]["by_reason"]["quota_requests"] > 0
    leases = sum(lease["requests_per_minute"] for lease in view["leases"])
    assert leases + view["reserved"]["requests_per_minute"] <= QUOTA + 0.01


async def test_a_bound_tenant_gets_leases_only_in_its_jurisdiction(quotas: Quotas) -> None:
    view = await quotas.view("eurobank")
    assert {lease["region"] for lease in view["leases"]} == {"eu-west"}
    total = sum(lease["requests_per_minute"] for lease in view["leases"])
    assert total == pytest.approx(1200, abs=0.01)


async def test_tokens_per_minute_are_shared_by_what_requests_used(quotas: Quotas) -> None:
    prompt = "tell me a long story " * 40  # some hundred tokens a request
    started = time.monotonic()
    sent = await _send(quotas, "tokened", {"us-west": 8.0}, ADAPT_S + WINDOW_S, prompt=prompt)
    since = started + ADAPT_S
    used = sum(s.tokens for s in sent if since <= s.at < since + WINDOW_S)
    per_request = max(s.tokens for s in sent)
    rate = TOKENS * WINDOW_S / 60
    # a request is admitted whole, so a window may end a request's tokens past its share
    assert 0.9 * rate <= used <= 1.05 * rate + TOKENS * BURST + per_request
    assert any(s.status == 429 for s in sent)


async def test_leases_hold_while_the_control_plane_is_down_then_static_shares(
    quotas: Quotas,
) -> None:
    """Last: it kills the control plane. eu-west holds 2 of the fleet's 8 GPUs: its static
    share is a quarter of the quota."""
    twice = 2 * QUOTA / 60
    warm = await _send(quotas, "paced", {"eu-west": twice}, ADAPT_S)
    assert _admitted(warm, 0, float("inf")) > 0
    killed = time.monotonic()
    sending = asyncio.create_task(_send(quotas, "paced", {"eu-west": twice}, 26.0))
    await quotas.fleet.kill_control_plane()
    sent = await sending
    low, high = _bounds(5.0)
    assert low <= _admitted(sent, killed + 1, killed + 6) <= high  # the lease holds
    expired = killed + 10 + 3  # its ttl, and a margin
    static_low, static_high = _bounds(10.0, 0.25)
    assert static_low <= _admitted(sent, expired, expired + 10) <= static_high
