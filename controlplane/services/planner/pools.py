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
- A machine whose node drains (a preemption notice) gives no capacity: the pool asks for
  one more in its place at once, so the engines leaving it have somewhere to start before
  the machine is taken.
- Spot: one engine of each deployment's GPUs come from pools that are not spot where the
  region has such pools, so a preemption wave takes no deployment's last engine (placement
  puts its first engine there: controlplane/snapshot/placement.py). A spot pool whose cloud
  has not started all it was asked for within `short_after_s` is short: held at what it has
  three times as long, and the region's other pools (on demand) are asked for the rest.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.domain import EngineBackend, NodeState, PdMode
from controlplane.services.planner.providers.base import Group, Provider, ProviderError
from controlplane.services.planner.sizing import Pool, PoolDecision, size_pools
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
    short_after_s: float = 600.0  # a spot pool lacking machines this long is short
    # and held at what it has three times as long, before it is asked for more again
    changed_at: dict[str, float] = field(default_factory=dict)  # pool: its last change
    short_since: dict[str, float] = field(default_factory=dict)  # spot pool: lacking since
    short_until: dict[str, float] = field(default_factory=dict)  # spot pool: held short until

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
        now = self.clock()
        short = {name: self._short(name, spec.spot, groups[name], now)
                 for name, spec in sorted(resizable.items()) if name in groups}  # fmt: skip
        pools = [Pool(name, spec.region, spec.gpus_per_node, spec.price_per_gpu_hour,
                      spec.min_nodes, _capped(spec.max_nodes, short[name]),
                      groups[name].desired, spec.spot)
                 for name, spec in sorted(resizable.items()) if name in groups]  # fmt: skip
        regions = {p.region for p in pools}
        wanted, on_demand = gpus_wanted(state, set(resizable), regions)
        for decision in size_pools(pools, wanted, on_demand):
            held, group = short[decision.pool], groups[decision.pool]
            if held is not None:
                lacking = f"spot short: its cloud started {held} of {group.desired}"
                decision = replace(decision, reason=f"{decision.reason}; {lacking}")
            leaving = leaving_machines(state, decision.pool, group)
            if leaving and decision.target < state.node_pools[decision.pool].max_nodes:
                more = min(leaving, state.node_pools[decision.pool].max_nodes - decision.target)
                decision = replace(decision, target=decision.target + more,
                                   reason=f"{decision.reason}; +{more} in place of machines "
                                          "whose nodes drain (a preemption notice)")  # fmt: skip
            out.append(await self._carry_out(state, decision, groups[decision.pool], acting))
        return out

    def _short(self, pool: str, spot: bool, group: Group, now: float) -> int | None:
        """A spot pool whose cloud has not started all it asked for within `short_after_s`:
        the machines it has (it is held there three times as long, and what it lacks is asked
        of the region's other pools); None for one that is not short."""
        listed = sum(1 for m in group.machines if m.state != "stopping")
        if spot and group.desired > listed:
            since = self.short_since.setdefault(pool, now)
            if now - since >= self.short_after_s:
                self.short_until[pool] = now + 3 * self.short_after_s
        else:
            self.short_since.pop(pool, None)
        if now < self.short_until.get(pool, float("-inf")):
            return listed
        return None

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
            listed = sum(1 for m in group.machines if m.state != "stopping")
            if listed < d.current:  # asked for machines its cloud never started: fewer first
                await provider.resize(spec.group, max(d.target, listed))
                if d.target >= listed:
                    return PoolOutcome(d, "shrunk", f"asks for {d.current - d.target} fewer, "
                                                    "never started")  # fmt: skip
                d = replace(d, current=listed)
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


def _capped(most: int, short: int | None) -> int:
    return most if short is None else min(most, short)


def gpus_wanted(
    state: FleetState, resizable: set[str], regions: set[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """Per region, the GPUs its engines want of its resizable pools: its deployments' as
    planned, less those of its active nodes in no resizable pool; and of those, the GPUs
    that must not be spot: one engine of each deployment, less those of its active nodes in
    no resizable pool and no spot pool."""
    wanted, on_demand = dict.fromkeys(regions, 0), dict.fromkeys(regions, 0)
    for name, spec in state.deployments.items():
        if spec.region not in wanted or spec.backend is EngineBackend.EXTERNAL:
            continue
        if spec.pd_mode is PdMode.DISAGGREGATED:
            count = spec.prefill_replicas + spec.decode_replicas
        else:
            count = engines(spec, state.planned.get(name))
        wanted[spec.region] += count * spec.tp_size * spec.dp_size
        on_demand[spec.region] += spec.tp_size * spec.dp_size if count else 0
    spot = {name for name, pool in state.node_pools.items() if pool.spot}
    for node in state.nodes.values():
        if node.region in wanted and node.state is NodeState.ACTIVE and node.pool not in resizable:
            wanted[node.region] -= len(node.gpus)
            if node.pool not in spot:
                on_demand[node.region] -= len(node.gpus)
    return ({region: max(0, n) for region, n in wanted.items()},
            {region: max(0, n) for region, n in on_demand.items()})  # fmt: skip


def leaving_machines(state: FleetState, pool: str, group: Group) -> int:
    """The group's machines whose node drains (a preemption notice, or an operator's drain):
    still in the group, and serving nothing new."""
    draining = {host_key(spec.hostname) for spec in state.nodes.values()
                if spec.pool == pool and spec.state is NodeState.DRAINING}  # fmt: skip
    return sum(1 for m in group.machines
               if m.state != "stopping" and host_key(m.hostname) in draining)  # fmt: skip


def host_key(hostname: str | None) -> str | None:
    """How a machine and its node are matched: by address, or by a name's first label (AWS
    names a machine ip-10-0-1-23.ec2.internal; its agent, by default, ip-10-0-1-23)."""
    if hostname is None:
        return None
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        return hostname.split(".", 1)[0].lower()
    return hostname


def idle_machines(state: FleetState, pool: str, group: Group) -> list[tuple[str, str]]:
    """The group's running machines whose active node (by hostname) is in the pool and runs
    no engine as the fleet is planned: (machine, node)."""
    region = state.node_pools[pool].region
    plans, _ = place(state, region)
    busy = {p.name for p in plans if p.engines}
    idle = {host_key(spec.hostname): name for name, spec in state.nodes.items()
            if spec.pool == pool and spec.state is NodeState.ACTIVE
            and name not in busy}  # fmt: skip
    return [(m.id, idle[key]) for m in group.machines
            if m.state == "running" and (key := host_key(m.hostname)) in idle]  # fmt: skip
