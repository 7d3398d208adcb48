"""What the agent says of itself, built in one place from its books (agents/books.py) and each
part's own `status()`: `/agent/status`, the families of `/metrics` that its state holds, and
the telemetry of each heartbeat to the control plane."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from prometheus_client.core import Metric

from agents.adapters.keeper import AdapterKeeper
from agents.adapters.metrics import adapter_families
from agents.books import Books
from agents.control.link import ControlLink
from agents.control.plan import inventory
from agents.control.preemption import PreemptionWatch
from agents.engines import gpus
from agents.engines.supervisor import Supervisor
from agents.gateway.service import Gateway
from agents.ledger.meter import Meter
from agents.metrics import state_families
from agents.quality.prober import Prober
from agents.settings import AgentSettings
from agents.telemetry import (
    TelemetryWindow,
    add_classes,
    add_quality,
    add_tenant_answers,
    add_tiers,
)
from agents.workers.kv_events import KvEventSubscriber
from agents.workers.poller import LoadPoller


class Agent(Protocol):
    """The parts the report reads (agents/daemon.py composes them)."""

    settings: AgentSettings
    books: Books
    gateway: Gateway
    supervisor: Supervisor
    poller: LoadPoller
    link: ControlLink
    kv_events: KvEventSubscriber
    prober: Prober
    adapters: AdapterKeeper
    preemption: PreemptionWatch
    nvml: Any
    window: TelemetryWindow
    meter: Meter | None
    snapshot: pb.Snapshot | None
    applied_at: float | None

    @property
    def source(self) -> str: ...


def status(agent: Agent) -> dict[str, Any]:
    """`/agent/status`."""
    link, gateway, books, snapshot = agent.link.state, agent.gateway, agent.books, agent.snapshot
    gpu_list = inventory(snapshot, link.node, agent.nvml)
    return {
        "region": agent.settings.region,
        "node": link.node or None,
        "revision": snapshot.revision if snapshot else None,
        "digest": snapshot.digest if snapshot else None,
        "source": agent.source,
        "control_plane": {
            "target": agent.settings.control_plane,
            "connected": link.connected,
            "last_error": link.last_error or None,
        },
        "engines": agent.supervisor.status(),
        "router": gateway.router.status()
        | {"kv_events": {w: s.events for w, s in agent.kv_events.subscriptions.items()}},
        "escalation": gateway.escalations.status(),
        "admission": {"waiting": dict(gateway.admission.waiting)},
        "quota_leases": gateway.quotas.status(),
        "budgets": gateway.quotas.budgets.status(),
        "faults": dict(books.faults),
        "preemption": (
            {"source": agent.preemption.notice.source, "deadline": agent.preemption.notice.deadline}
            if agent.preemption.notice is not None
            else None
        ),
        "quality": gateway.quality.status() | {"canaries": agent.prober.status()},
        "tiers": gateway.tiers.status(),
        "adapters": agent.adapters.status(),
        "migrations": [  # streams carried on after their worker failed, or not
            {"model": m, "to": to, "why": why, "count": n}
            for (m, to, why), n in sorted(books.migrations.items())
        ],
        "gpus": [
            {"index": g.index, "model": g.model, "memory_gb": g.memory_gb, "source": g.source}
            for g in gpu_list
        ],
    }


def metric_families(agent: Agent) -> list[Metric]:
    """The families of `/metrics` that the agent's books and state hold (read on the event
    loop)."""
    gateway = agent.gateway
    breakers = [("worker", v.worker_id, str(v.breaker.state))
                for v in gateway.router.views.values()]  # fmt: skip
    breakers += [("peer", r, str(v.breaker.state)) for r, v in gateway.escalations.peers.items()]
    return state_families(
        agent.books,
        revision=agent.snapshot.revision if agent.snapshot is not None else None,
        applied_at=agent.applied_at,
        waiting=dict(gateway.admission.waiting),
        breakers=breakers,
        held=gateway.quality.held_states(),
    ) + adapter_families(agent.adapters)


async def telemetry(agent: Agent) -> pb.Telemetry:
    """A heartbeat's telemetry."""
    gateway = agent.gateway
    gpu_list = inventory(agent.snapshot, agent.link.state.node, agent.nvml)
    used = await asyncio.to_thread(gpus.memory) if agent.nvml is not None else []
    runners = agent.supervisor.all()
    mark = agent.meter.mark() if agent.meter is not None else {}
    counters = await agent.poller.counters((r.spec.id, r.spec.url) for r in runners)
    if agent.meter is not None:
        agent.meter.read(counters, mark)
    told = agent.window.report(
        runners,
        gpu_list,
        used,
        counters,
        agent.books,
        gateway.receipts.kept,
        {v.worker_id: str(v.breaker.state) for v in gateway.router.views.values()},
        gateway.metrics.latency_totals(),
    )
    waiting = {m: n for m, n in gateway.admission.waiting.items() if n > 0}
    for answers in told.answers:
        answers.waiting = waiting.pop(answers.model, 0)
    # a model that waits for its first engine has answered nothing yet
    told.answers.extend(pb.ModelAnswers(model=m, waiting=n) for m, n in sorted(waiting.items()))
    notice = agent.preemption.notice
    if notice is not None:
        told.preemption.source = notice.source
        told.preemption.deadline.FromSeconds(int(notice.deadline))
    add_quality(told, gateway.quality)
    add_tenant_answers(told, agent.books)
    add_tiers(told, agent.books)
    add_classes(told, agent.books, gateway.metrics.wait_totals())
    told.adapters.extend(agent.adapters.seen())
    return told
