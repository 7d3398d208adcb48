"""What a snapshot asks of this node is checked before anything changes."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2
from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.control.plan import engine_specs
from agents.engines.backends import backends
from agents.engines.gpus import Gpu
from agents.errors import SnapshotInvalid

BACKENDS = backends()
CPU_BACKENDS = backends(cpu=True)  # a node without GPUs (no NVML): SGLang on its CPU


def engine(name: str, gpus: list[int], port: int, backend: str = "sim") -> pb.Engine:
    return pb.Engine(
        id=f"{name}/unified-0",
        deployment=name,
        model="llama",
        backend=backend,
        role="unified",
        gpu_indexes=gpus,
        port=port,
        url=f"http://127.0.0.1:{port}",
    )


def snapshot(
    *engines: pb.Engine, tp: int = 1, args: dict[str, float | str | bool] | None = None
) -> pb.Snapshot:
    engine_args = struct_pb2.Struct()
    engine_args.update(args or {})
    names = sorted({e.deployment for e in engines} | {"ext"})
    return pb.Snapshot(
        revision=7,
        digest="d",
        region=pb.RegionInfo(name="r1"),
        models=[pb.ModelInfo(name="llama", source="meta-llama/x", context_length=8192)],
        deployments=[
            pb.DeploymentInfo(
                name=n,
                model="llama",
                backend="external" if n == "ext" else "sim",
                tp_size=tp,
                dp_size=1,
                engine_args=engine_args,
            )
            for n in names
        ],
        nodes=[
            pb.NodePlan(
                name="n1",
                hostname="127.0.0.1",
                gpus=[pb.Gpu(index=i, model="H100", memory_gb=80) for i in range(2)],
                engines=list(engines),
            )
        ],
        workers=[
            pb.Worker(
                id="ext/external-0",
                model="llama",
                deployment="ext",
                role="unified",
                url="http://x:1",
            )
        ],
    )


def specs(snap: pb.Snapshot, nvml: list[Gpu] | None = None, region: str = "r1") -> list[str]:
    kinds = BACKENDS if nvml is not None else CPU_BACKENDS
    found = engine_specs(snap, region=region, node="n1", nvml=nvml, backends=kinds)
    return [f"{s.id}:{s.backend}:{list(s.gpu_indexes)}" for s in found]


def test_the_node_runs_its_engines_and_probes_the_region_external_ones() -> None:
    snap = snapshot(engine("a", [0], 30000), engine("b", [1], 30001))
    assert specs(snap) == [
        "a/unified-0:sim:[0]",
        "b/unified-0:sim:[1]",
        "ext/external-0:external:[]",
    ]
    assert specs(snap, nvml=[Gpu(0, "H100", 80, "nvml"), Gpu(1, "H100", 80, "nvml")])


@pytest.mark.parametrize(
    ("snap", "nvml", "message"),
    [
        (snapshot(engine("a", [0], 30000), engine("b", [0], 30001)), None, "GPU 0 is given to"),
        (snapshot(engine("a", [5], 30000)), None, r"no GPU \[5\]"),
        (snapshot(engine("a", [0], 30000), engine("b", [1], 30000)), None, "want port 30000"),
        (snapshot(engine("a", [0, 1], 30000, backend="sglang"), tp=2), None, "on its CPU"),
        (snapshot(engine("a", [0], 30000, backend="tpu")), None, "no backend named 'tpu'"),
        (snapshot(engine("a", [0], 30000), args={"bogus": 1}), None, "no flag --bogus"),
        (snapshot(engine("a", [1], 30000)), [Gpu(0, "H100", 80, "nvml")], r"no GPU \[1\]"),
    ],
)
def test_a_plan_this_node_cannot_run_is_refused(
    snap: pb.Snapshot, nvml: list[Gpu] | None, message: str
) -> None:
    with pytest.raises(SnapshotInvalid, match=message):
        specs(snap, nvml)


def test_sglang_runs_on_the_cpu_of_a_node_without_gpus() -> None:
    found = specs(snapshot(engine("a", [0], 30000, backend="sglang")))
    assert found[0] == "a/unified-0:sglang:[0]"


def test_a_snapshot_of_another_region_is_refused() -> None:
    with pytest.raises(SnapshotInvalid, match="not 'r2'"):
        specs(snapshot(), region="r2")
