"""The pure parts of the global quotas: shares in proportion to demand with a floor, leases
that change only when they change enough, and who shares a tenant's quota (and what is kept
aside for agents that cannot take a lease)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from meridian_pb.fleet.v1.demand import TenantDemand

from agents.config import compile_config
from controlplane.push.wire import to_wire
from controlplane.services.quotas.allocate import FLOOR, Claim, allocate, settle
from controlplane.services.quotas.demand import NodeDemand
from controlplane.services.quotas.plan import Timing, plan
from controlplane.snapshot.compiler import compile_region
from tests.kits.fleet_docs import example, state_from

NOW = datetime(2026, 11, 25, 12, tzinfo=UTC)
TIMING = Timing(ttl_s=10, forget_s=60)


def test_one_agent_that_wants_it_all_gets_all_but_the_others_floors() -> None:
    claims = {"a": Claim(1200), "b": Claim(0), "c": Claim(0), "d": Claim(0)}
    shares = allocate(600, claims)
    assert sum(shares.values()) == pytest.approx(600)
    assert shares["b"] == shares["c"] == shares["d"] == pytest.approx(600 * FLOOR / 4)
    assert shares["a"] >= 0.95 * 600


def test_wants_above_the_budget_share_it_in_proportion_so_every_request_has_one_chance() -> None:
    shares = allocate(600, {"a": Claim(200), "b": Claim(400), "c": Claim(600)}, floor=0)
    assert shares == pytest.approx({"a": 100, "b": 200, "c": 300})
    # two agents of one region splitting its traffic get what one agent would, together
    split = allocate(600, {"a1": Claim(200), "a2": Claim(200), "b": Claim(400)}, floor=0)
    assert split["a1"] + split["a2"] == pytest.approx(split["b"]) == pytest.approx(300)
    with_floor = allocate(600, {"a": Claim(200), "b": Claim(400), "c": Claim(600)})
    assert sum(with_floor.values()) == pytest.approx(600)
    assert with_floor["a"] < with_floor["b"] < with_floor["c"]


def test_wants_within_the_budget_are_met_and_the_spare_goes_by_weight() -> None:
    shares = allocate(600, {"a": Claim(100, weight=1), "b": Claim(200, weight=3)}, floor=0)
    assert shares == pytest.approx({"a": 100 + 300 / 4, "b": 200 + 300 * 3 / 4})


def test_what_nobody_wants_goes_out_by_weight() -> None:
    shares = allocate(600, {"a": Claim(0, weight=5), "b": Claim(0, weight=1)})
    assert shares["a"] == pytest.approx(6 + 588 * 5 / 6)  # its floor, and 5/6 of the rest
    assert sum(shares.values()) == pytest.approx(600)
    assert allocate(0, {"a": Claim(10)}) == {"a": 0.0}
    assert allocate(600, {}) == {}


def test_leases_that_change_little_stay_and_never_sum_above_the_budget() -> None:
    held = {"a": 300.0, "b": 300.0}
    assert settle({"a": 305.0, "b": 295.0}, held, 600, close=0.02) == {"a": 300.0, "b": 300.0}
    # a small fall kept needs room: here a small rise skipped makes it
    kept = settle({"a": 290.0, "b": 310.0}, held, 600, close=0.02)
    assert sum(kept.values()) <= 600
    moved = settle({"a": 100.0, "b": 500.0}, held, 600)
    assert moved == {"a": 100.0, "b": 500.0}


def _demand(node: str, region: str, **tenants: float) -> NodeDemand:
    told = {t: TenantDemand(admitted_requests=rate) for t, rate in tenants.items()}
    return NodeDemand(node, region, NOW, told)


def test_leases_follow_demand_within_residency_and_sum_to_the_quota() -> None:
    state = state_from(example())
    nodes = {"us-east-1": "us-east", "us-west-1": "us-west", "eu-west-1": "eu-west"}
    demand = {n: _demand(n, r, acme=5000, eurobank=1000) for n, r in nodes.items()}
    leases = plan(state, demand, set(nodes), {}, {}, NOW, TIMING)
    acme = leases["acme"]["leases"]
    assert set(acme) == set(nodes)
    assert sum(lease["requests_per_minute"] for lease in acme.values()) == pytest.approx(6000)
    assert acme["us-east-1"]["requests_per_minute"] == pytest.approx(2000)  # fair, not by GPUs
    # eurobank is bound to the EU: a lease in eu-west only, of the whole quota
    eurobank = leases["eurobank"]["leases"]
    assert list(eurobank) == ["eu-west-1"]
    assert eurobank["eu-west-1"]["requests_per_minute"] == pytest.approx(1200)


def test_an_agent_away_keeps_its_lease_until_it_expires_then_its_static_share() -> None:
    state = state_from(example())
    demand = {"us-east-1": _demand("us-east-1", "us-east", acme=6000)}
    given = {"acme": {"leases": {"us-west-1": {"region": "us-west",
                                               "requests_per_minute": 3000.0}}}}  # fmt: skip
    away = {"us-west-1": NOW - timedelta(seconds=5)}
    held = plan(state, demand, {"us-east-1"}, given, away, NOW, TIMING)["acme"]
    assert held["reserved"]["requests_per_minute"] == pytest.approx(3000)
    assert held["leases"]["us-east-1"]["requests_per_minute"] == pytest.approx(3000)
    # past its lease's expiry, us-west-1 may admit at its static share (1 GPU of 8)
    later = {"us-west-1": NOW - timedelta(seconds=20)}
    static = plan(state, demand, {"us-east-1"}, given, later, NOW, TIMING)["acme"]
    assert static["reserved"]["requests_per_minute"] == pytest.approx(6000 / 8)
    # gone for good: nothing kept aside
    gone = {"us-west-1": NOW - timedelta(seconds=120)}
    free = plan(state, demand, {"us-east-1"}, given, gone, NOW, TIMING)["acme"]
    assert free["leases"]["us-east-1"]["requests_per_minute"] == pytest.approx(6000)


def test_an_agent_that_reports_no_demand_is_left_its_static_share() -> None:
    """An agent that does not take leases (an older one, or one just connected) admits at its
    static share: that much is kept aside for it."""
    state = state_from(example())
    demand = {"us-east-1": _demand("us-east-1", "us-east", acme=6000)}
    leases = plan(state, demand, {"us-east-1", "eu-west-1"}, {}, {}, NOW, TIMING)["acme"]
    assert list(leases["leases"]) == ["us-east-1"]
    assert leases["reserved"]["requests_per_minute"] == pytest.approx(6000 * 2 / 8)


def test_static_shares_split_each_region_over_its_nodes_and_sum_to_the_quota() -> None:
    """What an agent admits without a lease: its region's share by GPUs over the region's
    nodes (a second node in us-east halves each one's), as the agents compile it from their
    snapshot and as the leader keeps it aside for an agent that takes no lease."""
    doc = example()
    doc["nodes"].append({"name": "us-east-2", "region": "us-east", "hostname": "127.0.0.4"})
    state = state_from(doc)
    static = {}
    for region in state.regions:
        config = compile_config(to_wire(compile_region(state, region)))
        for node, spec in state.nodes.items():
            if spec.region == region:
                static[node] = config.tenants["acme"].requests_per_minute
    assert static["us-east-1"] == static["us-east-2"] == pytest.approx(6000 * 5 / 8 / 2)
    assert sum(static.values()) == pytest.approx(6000)  # type: ignore[arg-type]
    demand = {"us-east-1": _demand("us-east-1", "us-east", acme=6000)}
    leases = plan(state, demand, {"us-east-1", "us-east-2"}, {}, {}, NOW, TIMING)["acme"]
    assert leases["reserved"]["requests_per_minute"] == pytest.approx(static["us-east-2"])


def test_a_tenants_limit_of_requests_under_way_is_leased_by_demand() -> None:
    """The default limit (256 at once, fleet-wide) goes to the agents by the most each held
    and what each refused for it; it sums to the limit."""
    state = state_from(example())
    nodes = {"us-east-1": "us-east", "us-west-1": "us-west", "eu-west-1": "eu-west"}
    demand = {n: NodeDemand(n, r, NOW, {"acme": TenantDemand(peak_concurrent=10.0)})
              for n, r in nodes.items()}  # fmt: skip
    demand["us-east-1"] = NodeDemand("us-east-1", "us-east", NOW, {
        "acme": TenantDemand(peak_concurrent=150.0, refused_concurrent=60.0)})  # fmt: skip
    leases = plan(state, demand, set(nodes), {}, {}, NOW, TIMING)["acme"]
    assert leases["quota"]["concurrent_requests"] == 256
    held = {n: lease["concurrent_requests"] for n, lease in leases["leases"].items()}
    assert sum(held.values()) == pytest.approx(256)
    assert held["us-east-1"] > 180  # it wants 210 of the 230 wanted
    assert held["us-west-1"] >= 10
