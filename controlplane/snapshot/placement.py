"""Engines onto GPUs: first fit, by name, so the same state always places the same way."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.domain import EngineBackend, NodeState, PdMode
from controlplane.schemas.fleet import DeploymentSpec, NodeSpec
from controlplane.snapshot.types import Engine, FleetState, NodePlan, Unplaced

ENGINE_BASE_PORT = 30000


@dataclass
class _Node:
    name: str
    spec: NodeSpec
    free: list[int]  # GPU indexes not yet given to an engine
    engines: list[Engine] = field(default_factory=list)

    def take(self, count: int, min_memory_gb: int) -> list[int] | None:
        fit = [i for i in self.free if self._memory(i) >= min_memory_gb][:count]
        if len(fit) < count:
            return None
        self.free = [i for i in self.free if i not in fit]
        return fit

    def _memory(self, index: int) -> int:
        return next(g.memory_gb for g in self.spec.gpus if g.index == index)


def _roles(spec: DeploymentSpec) -> list[tuple[str, int]]:
    if spec.pd_mode is PdMode.DISAGGREGATED:
        return [("prefill", spec.prefill_replicas), ("decode", spec.decode_replicas)]
    return [("unified", spec.replicas or 0)]


def place(state: FleetState, region: str) -> tuple[list[NodePlan], list[Unplaced]]:
    """Each GPU goes to at most one engine; what does not fit is reported, not dropped."""
    nodes = [
        _Node(name, spec, sorted(g.index for g in spec.gpus))
        for name, spec in sorted(state.nodes.items())
        if spec.region == region and spec.state is NodeState.ACTIVE
    ]
    unplaced: list[Unplaced] = []
    for name, spec in sorted(state.deployments.items()):
        if spec.region != region or spec.backend is EngineBackend.EXTERNAL:
            continue
        need = spec.tp_size * spec.dp_size
        memory = state.models[spec.model].min_gpu_memory_gb
        for role, count in _roles(spec):
            missing = 0
            for index in range(count):
                if not _place_one(nodes, name, spec, role, index, need, memory):
                    missing += 1
            if missing:
                unplaced.append(
                    Unplaced(
                        deployment=name,
                        role=role,
                        count=missing,
                        reason=f"no active node has {need} free GPU(s) with {memory} GB or more",
                    )
                )
    plans = [
        NodePlan(name=n.name, hostname=n.spec.hostname, gpus=n.spec.gpus, engines=n.engines)
        for n in nodes
    ]
    return plans, unplaced


def _place_one(
    nodes: list[_Node],
    name: str,
    spec: DeploymentSpec,
    role: str,
    index: int,
    need: int,
    memory: int,
) -> bool:
    for node in nodes:
        gpus = node.take(need, memory)
        if gpus is None:
            continue
        port = ENGINE_BASE_PORT + len(node.engines)
        node.engines.append(
            Engine(
                id=f"{name}/{role}-{index}",
                deployment=name,
                model=spec.model,
                backend=spec.backend,
                role=role,
                gpu_indexes=gpus,
                port=port,
                url=f"http://{node.spec.hostname}:{port}",
            )
        )
        return True
    return False
