"""A node's share of a tenant's quota, as token buckets: a share under one a minute still
admits at its rate, the shares of a region's agents never sum above the region's, and a node
with no share refuses with a Retry-After it can keep."""

from __future__ import annotations

import pytest

from agents.control.compile import Tenant
from agents.gateway.errors import QuotaExceeded
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
