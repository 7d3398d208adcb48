"""A tenant's spend budgets through the admin API: validated (a 4xx changes nothing), kept, and
compiled into every region's snapshot with the region's part of them."""

from __future__ import annotations

from typing import Any

import pytest

from agents.config import compile_config
from controlplane.push.wire import to_wire
from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE, example, state_from

MONTHLY = {"name": "monthly", "period": "month", "time_zone": "Asia/Kolkata", "limit": 250.5,
           "soft_percent": 75, "webhook_url": "http://127.0.0.1:9/hook"}  # fmt: skip


@pytest.fixture
async def base(api: Api) -> Api:
    assert (await api.client.post("/v1/apply", json=BASE)).status_code == 200
    return api


@pytest.mark.parametrize(
    "budgets",
    [
        [MONTHLY | {"time_zone": "Mars/Olympus"}],
        [MONTHLY | {"period": "week"}],
        [MONTHLY | {"limit": 0}],
        [MONTHLY | {"limit": 1e-9}],
        [MONTHLY | {"soft_percent": 120}],
        [MONTHLY | {"api_key": "not a prefix!"}],
        [MONTHLY | {"webhook_url": "ftp://x"}],
        [MONTHLY, MONTHLY | {"period": "day"}],  # two of one name
        [MONTHLY | {"currency": "EUR"}],
    ],
)
async def test_a_bad_budget_is_refused_and_changes_nothing(
    base: Api, budgets: list[dict[str, Any]]
) -> None:
    answer = await base.client.post("/v1/tenants", json={"name": "t", "budgets": budgets})
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json()["code"] == "validation_failed"
    assert (await base.client.get("/v1/tenants/t")).status_code == 404


async def test_budgets_are_kept_as_given(base: Api) -> None:
    daily = {"name": "key-daily", "period": "day", "limit": 5, "api_key": "mk_abc123"}
    made = await base.client.post("/v1/tenants", json={"name": "t", "budgets": [MONTHLY, daily]})
    assert made.status_code == 201, made.text
    kept = (await base.client.get("/v1/tenants/t")).json()["budgets"]
    assert kept[0] == MONTHLY | {"api_key": None}
    assert kept[1] == daily | {"time_zone": "UTC", "soft_percent": 80.0, "webhook_url": None}


def test_each_region_holds_its_part_of_the_budgets() -> None:
    doc = example()
    next(t for t in doc["tenants"] if t["name"] == "acme")["budgets"] = [MONTHLY]
    state = state_from(doc)
    parts = 0.0
    for region in state.regions:
        config = compile_config(to_wire(compile_region(state, region)))
        acme = config.tenants.get("acme")
        if acme is None or not acme.budgets:
            continue
        (rule,) = acme.budgets
        assert (rule.name, rule.period, rule.zone) == ("monthly", "month", "Asia/Kolkata")
        assert rule.limit_nanos == 250_500_000_000
        nodes = sum(1 for n in state.nodes.values() if n.region == region) or 1
        parts += rule.static_nanos * nodes / rule.limit_nanos
    assert parts == pytest.approx(1.0, abs=1e-6)  # the static parts sum to the limit
