"""Node pools through their clouds' groups: after the planner sizes engines, the GPUs each
region's engines want are spread over its resizable pools (core.size_pools), and each group
is asked for that many machines.

- A pool is resizable when it names its cloud's `group` and its cloud's provider has one
  here (aws, gcp, azure).
- The GPUs wanted of a region's pools are those of its engines as planned, less those of
  its active nodes outside them.
- Growing a group is one call. A group shrinks only by machines whose node runs no engine
  (the placement of the fleet as planned), named one by one, no sooner than the cool-down
  after its last change: a machine that serves is never taken, and one not joined yet (its
  node unknown) is on its way.
- A cloud that refuses is reported and tried again next period; nothing else changes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.domain import EngineBackend, NodeState, PdMode
from controlplane.services.planner.core import Pool, PoolDecision, size_pools
from controlplane.services.planner.providers.base import Group, Provider, ProviderError
from controlplane.settings import Settings
from controlplane.snapshot.placement import engines, place
from controlplane.snapshot.types import FleetState

log = logging.getLogger(__name__)


def providers_for(settings: Settings) -> dict[str, Provider]:
    """Each cloud provider's: the clouds' own, or the local fleet's simulated clouds for
    every one where `local_cloud_url` is set."""
    if settings.local_cloud_url is not None:
        from controlplane.services.planner.providers.local import LocalProvider

        token = settings.local_cloud_token
        local = LocalProvider(settings.local_cloud_url,
                              token.get_secret_value() if token is not None else "")  # fmt: skip
        return dict.fromkeys(("aws", "gcp", "azure"), local)
    return default_providers()


def default_providers() -> dict[str, Provider]:
    from controlplane.services.planner.providers.aws import AwsProvider
    from controlplane.services.planner.providers.azure import AzureProvider
    from controlplane.services.planner.providers.gcp import GcpProvider

    return {"aws": AwsProvider(), "gcp": GcpProvider(), "azure": AzureProvider()}


@dataclass(frozen=True)
class PoolOutcome:
    decision: PoolDecision
    done: str  # grown | shrunk | held | advised | failed | holds
    detail: str = ""
    released: tuple[str, ...] = ()  # the nodes of the machines let go

    def as_json(self) -> dict[str, Any]:
        d = self.decision
        return {"pool": d.pool, "region": d.region, "nodes": d.current, "target": d.target,
                "done": self.done, "reason": d.reason, "detail": self.detail}  # fmt: skip


@dataclass
class PoolKeeper:
    providers: Mapping[str, Provider] = field(default_factory=default_providers)
    cooldown_s: float = 300.0
    clock: Callable[[], float] = time.time
    changed_at: dict[str, float] = field(default_factory=dict)  # pool: its last change

    async def keep(self, state: FleetState, acting: bool) -> list[PoolOutcome]:
        resizable = {name: spec for name, spec in state.node_pools.items()
                     if spec.group is not None
                     and state.clouds[spec.cloud].provider in self.providers}  # fmt: skip
        if not resizable:
            return []
        groups: dict[str, Group] = {}
        out: list[PoolOutcome] = []
        for name, spec in sorted(resizable.items()):
            assert spec.group is not None
            try:
                groups[name] = await self._provider(state, name).read(spec.group)
            except ProviderError as error:
                stuck = PoolDecision(name, spec.region, 0, 0, "its group could not be read")
                out.append(PoolOutcome(stuck, "failed", str(error)))
        pools = [Pool(name, spec.region, spec.gpus_per_node, spec.price_per_gpu_hour,
                      spec.min_nodes, spec.max_nodes, groups[name].desired)
                 for name, spec in sorted(resizable.items()) if name in groups]  # fmt: skip
        regions = {p.region for p in pools}
        for decision in size_pools(pools, gpus_wanted(state, set(resizable), regions)):
            out.append(await self._carry_out(state, decision, groups[decision.pool], acting))
        return out

    def _provider(self, state: FleetState, pool: str) -> Provider:
        return self.providers[state.clouds[state.node_pools[pool].cloud].provider]

    async def _carry_out(
        self, state: FleetState, d: PoolDecision, group: Group, acting: bool
    ) -> PoolOutcome:
        if d.target == d.current:
            return PoolOutcome(d, "holds")
        if not acting:
            return PoolOutcome(d, "advised")
        spec, provider, now = state.node_pools[d.pool], self._provider(state, d.pool), self.clock()
        assert spec.group is not None
        try:
            if d.target > d.current:
                await provider.resize(spec.group, d.target)
                self.changed_at[d.pool] = now
                return PoolOutcome(d, "grown")
            since = now - self.changed_at.get(d.pool, float("-inf"))
            if since < self.cooldown_s:
                return PoolOutcome(d, "held", f"cool-down: {self.cooldown_s - since:.0f} s left")
            idle = idle_machines(state, d.pool, group)[: d.current - d.target]
            if not idle:
                return PoolOutcome(d, "held", "no machine of it is idle: none is taken")
            return await self._let_go(d, spec.group, provider, idle, now)
        except ProviderError as error:
            log.warning("pool %s: %s", d.pool, error)
            return PoolOutcome(d, "failed", str(error))

    async def _let_go(self, d: PoolDecision, group: str, provider: Provider,
                      idle: list[tuple[str, str]], now: float) -> PoolOutcome:  # fmt: skip
        """One by one; those let go before a refusal stay let go, and are reported."""
        gone: list[tuple[str, str]] = []
        refused = ""
        for machine, node in idle:
            try:
                await provider.remove(group, machine)
            except ProviderError as error:
                log.warning("pool %s: %s", d.pool, error)
                refused = str(error)
                break
            gone.append((machine, node))
        if not gone:
            return PoolOutcome(d, "failed", refused)
        self.changed_at[d.pool] = now
        detail = f"let go: {', '.join(m for m, _ in gone)}"
        detail += f"; then {refused}" if refused else ""
        return PoolOutcome(d, "shrunk", detail, tuple(n for _, n in gone))


def gpus_wanted(state: FleetState, resizable: set[str], regions: set[str]) -> dict[str, int]:
    """Per region, the GPUs its engines want of its resizable pools: its deployments' as
    planned, less those of its active nodes in no resizable pool."""
    wanted = dict.fromkeys(regions, 0)
    for name, spec in state.deployments.items():
        if spec.region not in wanted or spec.backend is EngineBackend.EXTERNAL:
            continue
        if spec.pd_mode is PdMode.DISAGGREGATED:
            count = spec.prefill_replicas + spec.decode_replicas
        else:
            count = engines(spec, state.planned.get(name))
        wanted[spec.region] += count * spec.tp_size * spec.dp_size
    for node in state.nodes.values():
        if node.region in wanted and node.state is NodeState.ACTIVE and node.pool not in resizable:
            wanted[node.region] -= len(node.gpus)
    return {region: max(0, n) for region, n in wanted.items()}


def idle_machines(state: FleetState, pool: str, group: Group) -> list[tuple[str, str]]:
    """The group's running machines whose active node (by hostname) is in the pool and runs
    no engine as the fleet is planned: (machine, node)."""
    region = state.node_pools[pool].region
    plans, _ = place(state, region)
    busy = {p.name for p in plans if p.engines}
    idle = {spec.hostname: name for name, spec in state.nodes.items() if spec.pool == pool
            and spec.state is NodeState.ACTIVE and name not in busy}  # fmt: skip
    return [(m.id, idle[m.hostname]) for m in group.machines
            if m.state == "running" and m.hostname in idle]  # fmt: skip
