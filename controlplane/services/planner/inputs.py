"""What the planner's core is given, read from the fleet and its heartbeats: the live nodes'
latest heartbeats, the deployments it sizes (with their bounds, prices, measured start times
and the peers their overload reaches), and each one's TTFT SLO."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.db.agent_rows import NodeTelemetryRow
from controlplane.db.fleet_rows import DeploymentRow, NodeRow, RegionRow
from controlplane.db.planner_rows import EnginePlanRow
from controlplane.domain import EngineBackend, FallbackTrigger, PdMode
from controlplane.services.planner.core import Deployment, Limits, start_times
from controlplane.services.planner.demand import Heartbeat
from controlplane.snapshot.placement import engines
from controlplane.snapshot.types import FleetState

DEFAULT_SLOTS = 256  # requests an engine runs at once, unless its engine_args say


async def heartbeats(session: AsyncSession) -> list[Heartbeat]:
    """The latest heartbeat of every node that is up."""
    rows = await session.execute(
        select(NodeRow.name, RegionRow.name, NodeTelemetryRow.observed_at, NodeTelemetryRow.data)
        .join(NodeTelemetryRow, NodeTelemetryRow.node_id == NodeRow.id)
        .join(RegionRow, RegionRow.id == NodeRow.region_id)
        .where(NodeRow.health == "up")
        .order_by(NodeRow.name)
    )  # fmt: skip
    return [Heartbeat(node, region, at.timestamp(), data) for node, region, at, data in rows]


async def plans_changed_at(session: AsyncSession) -> dict[str, float]:
    """When each planned deployment's engine count last changed."""
    rows = await session.execute(
        select(DeploymentRow.name, EnginePlanRow.changed_at)
        .join(EnginePlanRow, EnginePlanRow.deployment_id == DeploymentRow.id)
    )  # fmt: skip
    return {name: at.timestamp() for name, at in rows}


def autoscaled(
    state: FleetState, beats: list[Heartbeat], changed_at: dict[str, float], start_s: float
) -> dict[str, Deployment]:
    """The deployments the planner sizes: unified, on engines Meridian starts, `autoscale`."""
    starts = {region: start_times(e for b in beats if b.region == region
                                  for e in b.telemetry.get("engines", []))
              for region in state.regions}  # fmt: skip
    out = {}
    for name, spec in sorted(state.deployments.items()):
        scale = spec.autoscale
        if scale is None or spec.pd_mode is not PdMode.UNIFIED:
            continue
        if spec.backend is EngineBackend.EXTERNAL:
            continue
        prices = [p.price_per_gpu_hour for p in state.node_pools.values()
                  if p.region == spec.region]  # fmt: skip
        slots = spec.engine_args.get("max-running-requests", DEFAULT_SLOTS)
        out[name] = Deployment(
            model=spec.model,
            region=spec.region,
            engines=engines(spec, state.planned.get(name)),
            limits=Limits(
                scale.min_replicas,
                scale.max_replicas,
                scale.target_attainment,
                scale.headroom,
                scale.scale_to_zero,
                scale.local_share,
            ),
            gpus_per_engine=spec.tp_size * spec.dp_size,
            price_per_gpu_hour=min(prices, default=0.0),
            start_s=starts.get(spec.region, {}).get(spec.model, start_s),
            max_running=int(slots) if isinstance(slots, int | float | str) else DEFAULT_SLOTS,
            last_change_at=changed_at.get(name),
            peers=overflow_peers(state, spec.model, spec.region),
        )
    return out


def overflow_peers(state: FleetState, model: str, region: str) -> tuple[str, ...]:
    """The regions a region's requests for a model go to when it is overloaded, whoever asks:
    a fallback rule of the region for the model (or every model) and every tier, with the
    overload trigger; and of its peers, those in its jurisdiction (no tenant's residency
    forbids them). In the rules' order."""
    here = state.regions[region].jurisdiction
    out: list[str] = []
    for _, rule in sorted(state.fallback_rules.items()):
        if rule.region != region or rule.model not in (None, model) or rule.tenant_tier:
            continue
        if FallbackTrigger.OVERLOAD not in rule.triggers:
            continue
        out += [p for p in rule.peers if p not in out and p in state.regions
                and state.regions[p].jurisdiction == here]  # fmt: skip
    return tuple(out)


def routing_slos(state: FleetState) -> dict[tuple[str, str], float | None]:
    """Per (model, region), the TTFT SLO of its routing policy: the region's own, else the
    model's."""
    out: dict[tuple[str, str], float | None] = {}
    for spec in state.deployments.values():
        policies = [p for p in state.routing_policies.values() if p.model == spec.model]
        own = next((p for p in policies if p.region == spec.region), None)
        chosen = own or next((p for p in policies if p.region is None), None)
        slo = chosen.slo_ttft_ms if chosen is not None else None
        out[(spec.model, spec.region)] = slo / 1000 if slo is not None else None
    return out
