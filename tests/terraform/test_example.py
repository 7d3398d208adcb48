"""terraform/examples/three-clouds: the control plane on AWS and a GPU pool on each of AWS, GCP
and Azure. Its Google and Azure providers are not on this machine, so terraform cannot
validate or plan it here. What is checked instead, from its own source (parsed as HCL):

- every region of the fleet takes its name, gateway URL and token store from one same pool;
- fleet.yaml is what fleet-document renders from the example's inputs, and a real control
  plane takes it and serving.yaml;
- serving.yaml's engines fit the GPUs the pools make, as their agents will register them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import hcl2
import yaml

from controlplane.snapshot import compile_region
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import state_from
from tests.terraform.kit import TERRAFORM, render

EXAMPLE = TERRAFORM / "examples" / "three-clouds"
REFERENCE = re.compile(r"^\$\{module\.(\w+)\.(\w+)\}$")
# GPU memory of one GPU of each machine type the example uses: what an agent would report
GPU_MEMORY_GB = {"p5.48xlarge": 80, "a3-highgpu-8g": 80, "Standard_NC24ads_A100_v4": 80}


def _literal(value: Any) -> Any:
    """hcl2 keeps a string literal's quotes; anything else is as parsed."""
    if isinstance(value, str) and value.startswith('"') and value.endswith('"'):
        return value[1:-1]
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items() if k != "__is_block__"}
    if isinstance(value, list):
        return [_literal(v) for v in value]
    return value


def _modules() -> dict[str, dict[str, Any]]:
    parsed = hcl2.loads((EXAMPLE / "main.tf").read_text())
    return {_literal(name): _literal(body) for block in parsed["module"]
            for name, body in block.items()}  # fmt: skip


def _pools() -> dict[str, dict[str, Any]]:
    return {name: m for name, m in _modules().items()
            if m["source"].startswith("../../modules/nodepool-")}  # fmt: skip


def _fleet_inputs() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The fleet module's clouds and regions, each region's references resolved to its pool."""
    fleet, pools = _modules()["fleet"], _pools()
    regions = []
    for region in fleet["regions"]:
        # the region's name, gateway and token store: each the output of that name of one pool
        outputs = {"name": "region", "gateway_url": "gateway_url",
                   "bootstrap_token_store": "bootstrap_token_store"}  # fmt: skip
        sources = {key: REFERENCE.match(region[key]) for key in outputs}
        assert all(sources.values()), f"a region not from a pool's outputs: {region}"
        from_pools = {m.group(1) for m in sources.values() if m}
        assert len(from_pools) == 1, f"region {region['name']} mixes pools {from_pools}"
        (pool,) = from_pools
        assert {k: m.group(2) for k, m in sources.items() if m} == outputs
        regions.append({**region, "name": pools[pool]["region"], "pool": pool})
    return fleet["clouds"], regions


def test_each_region_is_wired_to_its_own_pool() -> None:
    clouds, regions = _fleet_inputs()
    pools = _pools()
    assert sorted(r["pool"] for r in regions) == sorted(pools)  # every pool, once
    for region in regions:
        source = pools[region["pool"]]["source"]
        assert source.endswith(f"nodepool-{clouds[region['cloud']]['provider']}"), region
        assert pools[region["pool"]]["control_plane"] == "${module.control_plane.grpc_target}"
    assert len({clouds[r["cloud"]]["provider"] for r in regions}) == 3  # three clouds
    assert _modules()["control_plane"]["source"] == "../../modules/controlplane-aws"


async def test_fleet_yaml_is_what_the_example_yields(tmp_path: Path, api: Api) -> None:
    clouds, regions = _fleet_inputs()
    shown = yaml.safe_load((EXAMPLE / "fleet.yaml").read_text())
    addresses = {r["name"]: r["gateway_url"] for r in shown["regions"]}
    given = [{key: r[key] for key in ("name", "cloud", "geography", "jurisdiction")}
             | {"gateway_url": addresses[r["name"]]} for r in regions]  # fmt: skip
    out = await render(tmp_path, "fleet-document", {"clouds": clouds, "regions": given})
    assert yaml.safe_load(out["document"]) == shown

    for document in ("fleet.yaml", "serving.yaml"):
        applied = await api.client.post("/v1/apply", content=(EXAMPLE / document).read_bytes(),
                                        headers={"Content-Type": "application/yaml"})  # fmt: skip
        assert applied.status_code == 200, f"{document}: {applied.text}"
        assert applied.json()["changed"]


def test_what_serving_yaml_deploys_fits_the_pools_gpus() -> None:
    _, regions = _fleet_inputs()
    pools = _pools()
    document = {
        **yaml.safe_load((EXAMPLE / "fleet.yaml").read_text()),
        **yaml.safe_load((EXAMPLE / "serving.yaml").read_text()),
    }
    document["nodes"] = []
    for region in regions:
        pool = pools[region["pool"]]
        kind = pool.get("instance_type") or pool.get("machine_type") or pool["vm_size"]
        gpu = {"model": kind, "memory_gb": GPU_MEMORY_GB[kind]}
        document["nodes"] += [
            {"name": f"{region['name']}-{n}", "region": region["name"], "hostname": f"h{n}",
             "gpus": [{"index": i, **gpu} for i in range(pool["gpus_per_node"])]}
            for n in range(pool["node_count"])
        ]  # fmt: skip
    for region in regions:
        snapshot = compile_region(state_from(document), region["name"])
        assert snapshot.unplaced == [], f"{region['name']}: {snapshot.unplaced}"
        deployed = [d for d in document["deployments"] if d["region"] == region["name"]]
        engines = [e for node in snapshot.nodes for e in node.engines]
        assert {e.deployment for e in engines} == {d["name"] for d in deployed}
