"""A node's share of a tenant's quota, as token buckets: a share under one a minute still
admits at its rate, the shares of a region's agents never sum above the region's, and a node
with no share refuses with a Retry-After it can keep."""

from __future__ import annotations

import pytest
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.config import Tenant
from agents.gateway.budgets import duration
from agents.gateway.errors import QuotaExceeded, TenantConcurrency
from agents.gateway.quotas import Quotas


def _tenant(rpm: float | None, tpm: float | None = None) -> Tenant:
    return Tenant("t", "standard", None, rpm, tpm)


def _admitted(quotas: Quotas, tenant: Tenant, tokens: int = 1) -> bool:
    try:
        with quotas.admit(tenant, tokens):
            return True
    except QuotaExceeded:
        return False


def test_a_share_under_one_a_minute_admits_at_its_rate() -> None:
    now = [0.0]
    quotas = Quotas(clock=lambda: now[0])
    half = _tenant(0.5)  # 1 a minute over 2 agents
    admitted = []
    while now[0] < 600:
        admitted.append(_admitted(quotas, half))
        now[0] += 10
    assert sum(admitted) == 5  # one at once, then one every two minutes: 0.5 a minute


def test_a_node_with_no_share_refuses_with_a_minute_s_retry() -> None:
    quotas = Quotas(clock=lambda: 0.0)
    with pytest.raises(QuotaExceeded) as refused:
        quotas.admit(_tenant(0.0), 1)
    assert refused.value.retry_after_s == 60
    with pytest.raises(QuotaExceeded):
        quotas.admit(_tenant(None, 0.0), 1)


def test_three_agents_share_ten_a_minute_and_admit_no_more_over_ten_minutes() -> None:
    now = [0.0]
    agents = [Quotas(clock=lambda: now[0]) for _ in range(3)]
    share = _tenant(10 / 3)
    served = 0
    while now[0] < 600:
        served += sum(_admitted(q, share) for q in agents)
        now[0] += 1
    assert served <= 10 * 10 + 3 * 10 / 3  # the rate, and each bucket's first fill


def _leased(tenant: str, rpm: float, quota: int, ttl_s: float = 10.0) -> pb.Leases:
    return pb.Leases(ttl_s=ttl_s, set=[pb.Lease(tenant=tenant, requests_per_minute=rpm,
                                                quota_requests_per_minute=quota)])  # fmt: skip


def test_a_lease_replaces_the_static_share_until_it_expires() -> None:
    now = [0.0]
    quotas = Quotas(clock=lambda: now[0])
    static = Tenant("t", "standard", None, 60.0, None, quota_requests_per_minute=180)
    quotas.take_leases(_leased("t", 600.0, 1800))  # a lease of another quota: not used
    assert quotas.shares(static, now[0]) == (60.0, None)
    quotas.take_leases(_leased("t", 150.0, 180))
    assert quotas.shares(static, now[0]) == (150.0, None)
    now[0] = 9.0
    quotas.take_leases(pb.Leases(ttl_s=10.0))  # a renewal: nothing changed
    now[0] = 18.0
    assert quotas.shares(static, now[0]) == (150.0, None)
    now[0] = 19.5  # ten seconds past the renewal
    assert quotas.shares(static, now[0]) == (60.0, None)
    quotas.take_leases(pb.Leases(ttl_s=10.0, dropped=["t"]))
    assert "t" not in quotas.leases


def test_a_quota_refusal_says_the_limit_what_remains_and_when_it_is_full() -> None:
    now = [0.0]
    quotas = Quotas(clock=lambda: now[0])
    tenant = Tenant("t", "standard", None, 60.0, None, quota_requests_per_minute=180)
    assert _admitted(quotas, tenant)
    assert _admitted(quotas, tenant)  # two seconds of a request a second
    with pytest.raises(QuotaExceeded) as refused:
        quotas.admit(tenant, 1)
    headers = refused.value.headers or {}
    assert headers["x-ratelimit-limit-requests"] == "180"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "2s"
    assert refused.value.retry_after_s == 1
    assert duration(0.25) == "250ms"
    assert duration(360) == "6m0s"


def test_demand_is_what_was_admitted_and_refused_over_the_last_seconds() -> None:
    now = [0.0]
    quotas = Quotas(clock=lambda: now[0])
    tenant = Tenant("t", "standard", None, 60.0, None)
    for _ in range(30):  # 3 s at ten a second against a share of one a second
        _admitted(quotas, tenant, tokens=100)
        now[0] += 0.1
    told = {t.tenant: t for t in quotas.demand.report().tenants}["t"]
    assert told.admitted_requests + told.refused_requests == pytest.approx(600, rel=0.01)
    assert told.admitted_requests == pytest.approx(4 * 20, rel=0.01)  # 2 at once, then 1 a s
    assert told.refused_by_reason["quota_requests"] == pytest.approx(told.refused_requests)
    now[0] += 10
    quotas.demand.report()
    assert not quotas.demand.report().tenants  # nothing in the last seconds


def test_requests_under_way_at_once_stop_at_the_nodes_share_of_the_limit() -> None:
    """Each admitted request holds one of the tenant's places until its `with` ends; past
    this node's share of the limit (its lease, of the limit it is a share of), 429
    tenant_concurrency, counted for the demand the leases follow."""
    quotas = Quotas(clock=lambda: 0.0)
    tenant = Tenant("t", "standard", None, None, None, max_concurrency=2.5,
                    quota_concurrency=10)  # fmt: skip
    first, second = quotas.admit(tenant, 1), quotas.admit(tenant, 1)
    with first, second, pytest.raises(TenantConcurrency) as refused:
        quotas.admit(tenant, 1)
    assert refused.value.code == "tenant_concurrency"
    assert refused.value.status == 429
    with quotas.admit(tenant, 1):  # both ended: room again
        pass
    quotas.take_leases(pb.Leases(ttl_s=10, set=[pb.Lease(
        tenant="t", concurrent_requests=4.0, quota_concurrent_requests=10)]))  # fmt: skip
    held = [quotas.admit(tenant, 1) for _ in range(4)]
    with pytest.raises(TenantConcurrency):
        quotas.admit(tenant, 1)
    for charge in held:
        charge.__exit__(None, None, None)
    told = {t.tenant: t for t in quotas.demand.report().tenants}["t"]
    assert told.peak_concurrent == 4
    assert told.refused_concurrent == 2
