"""Each spend budget's window split over the agents by demand: their ceilings (SpendLease). No I/O.

A budget is a stock, not a rate: what an agent spent stays spent. Every agent of the tenant's
serving regions starts each window on its static part of the limit (the region's part by
GPUs, split over its nodes: the parts sum to the limit). From the agents' reports (what each
spent and holds, the ceiling it spends within and which lease that is, and what it spent and
was refused lately), the leader moves what is left to where it is wanted:

- an agent's ceiling may be lowered only to what it spent and holds: it applies a lower one
  as `max(ceiling, spent + held)` then, and reports it;
- until an agent reports the newest lease it was sent, the leader counts the greater of that
  lease and the ceiling it last reported; an agent that does not report (away, or not yet
  on a lease this window) counts at the greatest it may spend within;
- so what the leader counts for the agents never sums above the limit, and an increase is
  given only out of what that leaves: raising one agent waits for another's decrease to be
  reported. With the control plane away, each agent spends within its ceiling and no further.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meridian_pb.fleet.v1.budgets import NANOS, Budget, window

from controlplane.domain import NodeState
from controlplane.services.quotas.demand import NodeDemand
from controlplane.snapshot import FleetState

BudgetDoc = dict[str, Any]  # see `plan_budget`
IDLE_SHARE = 0.25  # of what is left, spread evenly over the agents, wanted or not
STEP = 1e-3  # a ceiling changes by at least this part of the limit (no churn)


@dataclass(frozen=True)
class Agent:
    node: str
    static: int  # its static part of the limit (nanos)
    report: dict[str, Any] | None  # its BudgetUse for this window, if fresh


def plan_budget(
    budget: Budget, agents: list[Agent], given: BudgetDoc | None, at_s: float
) -> BudgetDoc:
    """One budget's doc for the window holding `at_s`: {"window", "limit", "used" (the
    fleet's spent and held, as counted), "soft" (its soft threshold was passed in this
    window), "leases": {node: {"ceiling", "seq" (the newest lease sent; 0: none), "pending"
    ([seq, ceiling] of the leases sent that it has not reported applying: it may spend within
    any of them, as they come in any order), "applied", "used" (as it reported them), "fleet"
    (the fleet's used when the newest lease was made)}}}."""
    name, _, _ = window(budget.period, budget.time_zone, at_s)
    limit = round(budget.limit * NANOS)
    same = given is not None and given.get("window") == name and given.get("limit") == limit
    before: dict[str, dict[str, Any]] = dict(given["leases"]) if same and given else {}
    leases: dict[str, dict[str, Any]] = {}
    committed: dict[str, int] = {}
    floors: dict[str, int] = {}
    wants: dict[str, float] = {}
    fixed = used = 0
    for agent in agents:
        pushed = before.get(agent.node, {})
        seq = int(pushed.get("seq", 0))
        pending = [(int(s), int(c)) for s, c in pushed.get("pending", [])]
        report = agent.report if agent.report and agent.report.get("window") == name else None
        if report is not None:
            applied, told = int(report["ceiling"]), int(report["seq"])
            pending = [(s, c) for s, c in pending if s > told]  # superseded by what it applies
            floor = int(report["used"]) + int(report["held"])
            committed[agent.node] = max([applied, *(c for _, c in pending)])
            floors[agent.node], wants[agent.node] = floor, float(report.get("wants", 0.0))
            used += floor
            leases[agent.node] = {"ceiling": int(pushed.get("ceiling", 0)), "seq": seq,
                                  "pending": pending, "applied": applied, "used": floor,
                                  "fleet": int(pushed.get("fleet", 0))}  # fmt: skip
        else:  # it may spend up to the most it was given or holds
            applied = int(pushed.get("applied", 0))
            fixed += max([agent.static, applied, *(c for _, c in pending)])
            used += int(pushed.get("used", 0))
            if pushed:
                leases[agent.node] = dict(pushed)
    free = limit - fixed - sum(floors.values())
    targets = _targets(floors, wants, max(0, free))
    room = limit - fixed - sum(committed.values())
    step = max(1, int(limit * STEP))
    for node in sorted(targets, key=lambda n: committed[n] - targets[n]):  # lowered first
        target, now = targets[node], committed[node]
        lease = leases[node]
        if target < now - step:  # lowered: counted at `now` until it reports it applied
            _send(lease, target, used)
        elif target > now + step and room > 0:
            raised = now + min(target - now, room)
            room -= raised - now
            _send(lease, raised, used)
    soft = bool(same and given and given.get("soft")) or used >= limit * budget.soft_percent / 100
    return {"window": name, "limit": limit, "used": used, "soft": soft, "leases": leases}


def _send(lease: dict[str, Any], ceiling: int, fleet: int) -> None:
    seq = lease["seq"] + 1
    lease.update(ceiling=ceiling, seq=seq, fleet=fleet, pending=[*lease["pending"], (seq, ceiling)])


def _targets(floors: dict[str, int], wants: dict[str, float], free: int) -> dict[str, int]:
    """Each reporting agent's ceiling: what it spent and holds, and a part of what is free by
    what it wanted lately (IDLE_SHARE of it evenly, so that an agent that was not asked
    lately still has some)."""
    if not floors:
        return {}
    total = sum(wants.values())
    even = free * (IDLE_SHARE if total > 0 else 1.0) / len(floors)
    by_want = free * (1 - IDLE_SHARE) if total > 0 else 0.0
    return {n: floors[n] + int(even + (by_want * wants[n] / total if total else 0))
            for n in floors}  # fmt: skip


def plan_spend(
    state: FleetState,
    tenant: str,
    regions: dict[str, float],
    split_over: dict[str, int],
    demand: dict[str, NodeDemand],
    connected: set[str],
    given: dict[str, BudgetDoc],
    at_s: float,
) -> dict[str, BudgetDoc]:
    """The tenant's budgets, each split over its agents (`regions`: each serving region's
    part of the limit; `split_over`: over how many nodes a region's part is split)."""
    spec = state.tenants[tenant]
    nodes = sorted(n for n, s in state.nodes.items()
                   if s.region in regions and s.state is NodeState.ACTIVE)  # fmt: skip
    out = {}
    for budget in spec.budgets:
        agents = []
        limit = budget.limit * NANOS
        for node in nodes:
            region = state.nodes[node].region
            static = int(limit * regions[region] / split_over[region])
            told = demand.get(node)
            usage = told.tenants.get(tenant) if told is not None and node in connected else None
            report = usage.spend.get(budget.name) if usage is not None else None
            agents.append(Agent(node, static, report))
        out[budget.name] = plan_budget(budget, agents, given.get(budget.name), at_s)
    return out
