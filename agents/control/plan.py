"""From a region's snapshot to this node's engines, checked before anything changes.

A snapshot that cannot run here (another region, a GPU given twice or missing, engine_args a
backend refuses) raises SnapshotInvalid: the agent nacks it and keeps the one it has.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from google.protobuf import json_format
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.engines.base import Backend, EngineSpec, Scalar
from agents.engines.gpus import Gpu
from agents.errors import SnapshotInvalid

GPU_BACKENDS = {"sglang", "sim"}


def node_plan(snapshot: pb.Snapshot, node: str) -> pb.NodePlan | None:
    return next((p for p in snapshot.nodes if p.name == node), None)


def inventory(snapshot: pb.Snapshot | None, node: str, nvml: list[Gpu] | None) -> list[Gpu]:
    """NVML's GPUs where there is NVML; else the GPUs the snapshot declares for this node."""
    if nvml is not None:
        return nvml
    plan = node_plan(snapshot, node) if snapshot is not None else None
    if plan is None:
        return []
    return [Gpu(g.index, g.model, g.memory_gb, "declared") for g in plan.gpus]


def engine_specs(
    snapshot: pb.Snapshot,
    *,
    region: str,
    node: str,
    nvml: list[Gpu] | None,
    backends: Mapping[str, Backend],
) -> list[EngineSpec]:
    """This node's engines and the region's external ones; raises SnapshotInvalid."""
    if snapshot.region.name != region:
        raise SnapshotInvalid(
            f"the snapshot is for region {snapshot.region.name!r}, not {region!r}"
        )
    if snapshot.revision <= 0:
        raise SnapshotInvalid(f"revision {snapshot.revision} is not a revision")
    deployments = {d.name: d for d in snapshot.deployments}
    models = {m.name: m for m in snapshot.models}
    specs: list[EngineSpec] = []
    plan = node_plan(snapshot, node)
    for engine in plan.engines if plan is not None else ():
        deployment = deployments.get(engine.deployment)
        model = models.get(engine.model)
        if deployment is None or model is None:
            raise SnapshotInvalid(
                f"engine {engine.id}: its deployment or model is not in the snapshot"
            )
        args = (
            json_format.MessageToDict(deployment.engine_args)
            if deployment.HasField("engine_args")
            else {}
        )
        specs.append(
            EngineSpec(
                id=engine.id,
                deployment=engine.deployment,
                model=engine.model,
                backend=engine.backend,
                role=engine.role,
                url=engine.url,
                host=plan.hostname if plan is not None else "127.0.0.1",
                port=engine.port,
                gpu_indexes=tuple(engine.gpu_indexes),
                model_source=model.source,
                context_length=model.context_length,
                tp_size=deployment.tp_size or 1,
                dp_size=deployment.dp_size or 1,
                engine_args=tuple(sorted((str(k), _scalar(v)) for k, v in args.items())),
                bootstrap_port=engine.bootstrap_port if engine.HasField("bootstrap_port") else None,
                kv_events_port=engine.kv_events_port if engine.HasField("kv_events_port") else None,
                drain_timeout_s=(
                    deployment.drain_timeout_s if deployment.HasField("drain_timeout_s") else None
                ),
            )
        )
    for worker in snapshot.workers:
        deployment = deployments.get(worker.deployment)
        if (
            not worker.HasField("node")
            and deployment is not None
            and deployment.backend == "external"
        ):
            specs.append(
                EngineSpec(
                    worker.id, worker.deployment, worker.model, "external", worker.role, worker.url
                )
            )
    _check(specs, inventory(snapshot, node, nvml), backends)
    return specs


def _check(specs: list[EngineSpec], gpus: list[Gpu], backends: Mapping[str, Backend]) -> None:
    for engine_id, n in Counter(s.id for s in specs).items():
        if n > 1:
            raise SnapshotInvalid(f"engine {engine_id} appears {n} times")
    ports = Counter((s.host, s.port) for s in specs if s.backend != "external")
    for (host, port), n in ports.items():
        if n > 1:
            raise SnapshotInvalid(f"{n} engines want port {port} on {host}")
    have = {g.index for g in gpus}
    given: dict[int, str] = {}
    for spec in specs:
        backend = backends.get(spec.backend)
        if backend is None:
            raise SnapshotInvalid(f"engine {spec.id}: no backend named {spec.backend!r}")
        if spec.backend in GPU_BACKENDS:
            missing = sorted(set(spec.gpu_indexes) - have)
            if missing:
                raise SnapshotInvalid(f"engine {spec.id}: this node has no GPU {missing}")
            for index in spec.gpu_indexes:
                if index in given:
                    raise SnapshotInvalid(f"GPU {index} is given to {given[index]} and {spec.id}")
                given[index] = spec.id
        backend.validate(spec)


def _scalar(value: object) -> Scalar:
    if isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    return str(value)
