"""Engines onto GPUs: sticky first, then first fit, so the same state always places the same way.

An engine that has a slot (the node, GPUs and port it was given before, kept in PostgreSQL)
keeps it while that slot still fits: the node is active, the GPUs exist, are free and have
the memory, and the port is free. Only the engines without a slot that fits are placed anew:
first fit over the nodes by name, on the lowest free port. Adding or removing a deployment
therefore moves no other engine.

Spot: a new engine goes to a node of a spot pool only after nodes where it is safer, unless
its deployment already runs an engine outside that pool. So a deployment's first engine
goes on demand where it can, and one preemption wave (a spot pool's machines taken back)
never takes all of a deployment's engines while the region has room elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from controlplane.domain import EngineBackend, NodeState, PdMode
from controlplane.schemas.fleet import DeploymentSpec, NodeSpec
from controlplane.snapshot.types import Engine, FleetState, NodePlan, Slot, Unplaced

# Engines listen on 30000-30499, prefill engines' PD bootstrap on their port + 1000 and KV-cache
# events on their port + 2000: all below Linux's ephemeral range (32768 up), so no outgoing
# connection on the node takes them, and a subscriber that reconnects to a port nobody
# listens on yet cannot connect to itself (TCP's simultaneous open) and hold it.
ENGINE_BASE_PORT = 30000
ENGINE_PORTS = 500
BOOTSTRAP_PORT_OFFSET = 1_000  # a prefill engine serves its PD bootstrap port here
KV_EVENTS_PORT_OFFSET = 2_000  # an engine publishes its KV-cache events here


@dataclass
class _Node:
    name: str
    spec: NodeSpec
    free: list[int]  # GPU indexes not yet given to an engine
    engines: list[Engine] = field(default_factory=list)

    def fits(self, gpus: list[int], min_memory_gb: int) -> bool:
        return all(i in self.free and self._memory(i) >= min_memory_gb for i in gpus)

    def first_fit(self, count: int, min_memory_gb: int) -> list[int] | None:
        fit = [i for i in self.free if self._memory(i) >= min_memory_gb][:count]
        return fit if len(fit) == count else None

    def port_free(self, port: int) -> bool:
        return all(e.port != port for e in self.engines)

    def lowest_free_port(self) -> int:
        taken = {e.port for e in self.engines}
        ports = range(ENGINE_BASE_PORT, ENGINE_BASE_PORT + ENGINE_PORTS)
        return next(p for p in ports if p not in taken)

    def add(self, engine: Engine) -> None:
        self.free = [i for i in self.free if i not in engine.gpu_indexes]
        self.engines.append(engine)

    def _memory(self, index: int) -> int:
        return next((g.memory_gb for g in self.spec.gpus if g.index == index), -1)


@dataclass(frozen=True)
class _Want:
    engine_id: str
    deployment: str
    spec: DeploymentSpec
    role: str
    need: int
    memory: int


def engines(spec: DeploymentSpec, planned: int | None) -> int:
    """A unified deployment's engines: the planner's count within its `autoscale` bounds (an
    older intent's bounds too, while a rollout holds one), else its `replicas`."""
    if spec.autoscale is None or planned is None:
        return spec.replicas or 0
    return min(spec.autoscale.max_replicas, max(spec.autoscale.min_replicas, planned))


def _roles(spec: DeploymentSpec, planned: int | None) -> list[tuple[str, int]]:
    if spec.pd_mode is PdMode.DISAGGREGATED:
        return [("prefill", spec.prefill_replicas), ("decode", spec.decode_replicas)]
    return [("unified", engines(spec, planned))]


def place(state: FleetState, region: str) -> tuple[list[NodePlan], list[Unplaced]]:
    """Each GPU goes to at most one engine; what does not fit is reported, not dropped."""
    nodes = {
        name: _Node(name, spec, sorted(g.index for g in spec.gpus))
        for name, spec in sorted(state.nodes.items())
        if spec.region == region and spec.state is NodeState.ACTIVE
    }
    wants = _wants(state, region)
    homeless = [w for w in wants if not _keep(nodes, w, state.slots.get(w.engine_id))]
    spot = {name for name, pool in state.node_pools.items() if pool.spot}
    held: dict[str, set[str | None]] = {}  # deployment: the pools its engines are on
    if spot:
        for node in nodes.values():
            for engine in node.engines:
                held.setdefault(engine.deployment, set()).add(node.spec.pool)
    missing: dict[tuple[str, str], tuple[int, _Want]] = {}
    for want in homeless:
        if not _first_fit(nodes, want, spot, held):
            count, _ = missing.get((want.deployment, want.role), (0, want))
            missing[(want.deployment, want.role)] = (count + 1, want)
    unplaced = [
        Unplaced(
            deployment=w.deployment,
            role=w.role,
            count=count,
            reason=f"no active node has {w.need} free GPU(s) with {w.memory} GB or more",
        )
        for count, w in missing.values()
    ]
    plans = [
        NodePlan(
            name=n.name,
            hostname=n.spec.hostname,
            gpus=n.spec.gpus,
            engines=sorted(n.engines, key=lambda e: e.id),
        )
        for n in nodes.values()
    ]
    return plans, unplaced


def _wants(state: FleetState, region: str) -> list[_Want]:
    wants = []
    for name, spec in sorted(state.deployments.items()):
        if spec.region != region or spec.backend is EngineBackend.EXTERNAL:
            continue
        memory = state.models[spec.model].min_gpu_memory_gb
        for role, count in _roles(spec, state.planned.get(name)):
            for index in range(count):
                engine_id = f"{name}/{role}-{index}"
                wants.append(
                    _Want(engine_id, name, spec, role, spec.tp_size * spec.dp_size, memory)
                )
    return wants


def _keep(nodes: dict[str, _Node], want: _Want, slot: Slot | None) -> bool:
    """Give the engine its old slot back if that still fits."""
    if slot is None or slot.node not in nodes or len(slot.gpu_indexes) != want.need:
        return False
    node = nodes[slot.node]
    if not node.fits(slot.gpu_indexes, want.memory) or not node.port_free(slot.port):
        return False
    node.add(_engine(node, want, sorted(slot.gpu_indexes), slot.port))
    return True


def _first_fit(
    nodes: dict[str, _Node], want: _Want, spot: set[str], held: dict[str, set[str | None]]
) -> bool:
    """The first node by name that fits; with spot pools, those of a spot pool that holds
    all the deployment's engines so far (any spot pool, for its first) after the rest."""
    order: Iterable[_Node] = nodes.values()
    if spot:
        pools = held.setdefault(want.deployment, set())

        def exposed(node: _Node) -> bool:
            return node.spec.pool in spot and not pools - {node.spec.pool}

        order = sorted(order, key=exposed)  # stable: by name within each
    for node in order:
        gpus = node.first_fit(want.need, want.memory)
        if gpus is not None:
            node.add(_engine(node, want, gpus, node.lowest_free_port()))
            if spot:
                held[want.deployment].add(node.spec.pool)
            return True
    return False


def _engine(node: _Node, want: _Want, gpus: list[int], port: int) -> Engine:
    return Engine(
        id=want.engine_id,
        deployment=want.deployment,
        model=want.spec.model,
        backend=want.spec.backend,
        role=want.role,
        gpu_indexes=gpus,
        port=port,
        url=f"http://{node.spec.hostname}:{port}",
        bootstrap_port=port + BOOTSTRAP_PORT_OFFSET if want.role == "prefill" else None,
    )
