"""Node pools through their clouds' groups, against PostgreSQL and moto's server: the group of
a pool grows to hold the GPUs its region's engines want; it shrinks only by machines whose
node runs no engine, never one that serves; a pool without a group is left to its operator;
advice changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import boto3

from controlplane.services.fleet_state import load_fleet_state
from controlplane.services.planner.pools import PoolKeeper, host_key
from controlplane.services.planner.providers.aws import AwsProvider
from tests.controlplane.planner.test_aws_provider import make_group
from tests.kits.controlplane import Api
from tests.kits.fleet_docs import BASE
from tests.kits.moto import REGION, moto

__all__ = ["moto"]  # the fixture
GPU = {"model": "H100-SXM-80GB", "memory_gb": 80}


def _hostnames(group: str) -> list[str]:
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    ec2 = boto3.client("ec2", region_name=REGION)
    made = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    ids = sorted(i["InstanceId"] for i in made["AutoScalingGroups"][0]["Instances"])
    found = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return sorted(i["PrivateDnsName"] for r in found for i in r["Instances"])


def _desired(group: str) -> int:
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    made = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    return int(made["AutoScalingGroups"][0]["DesiredCapacity"])


def _fleet(group: str | None, hosts: list[str], replicas: int) -> dict[str, Any]:
    pool = {"name": "east-h100", "cloud": "aws", "region": "us-east",
            "gpu_model": "H100-SXM-80GB", "gpus_per_node": 8, "price_per_gpu_hour": 4.0,
            "max_nodes": 4, **({"group": f"{REGION}/{group}"} if group else {})}  # fmt: skip
    return {
        **BASE,
        "node_pools": [pool],
        "nodes": [{"name": f"east-{i}", "region": "us-east", "pool": "east-h100",
                   "hostname": host, "gpus": [{"index": g, **GPU} for g in range(8)]}
                  for i, host in enumerate(hosts)],
        "deployments": [{"name": "llama-east", "model": "llama-8b", "region": "us-east",
                         "replicas": replicas}],
    }  # fmt: skip


async def _keep(api: Api, keeper: PoolKeeper, acting: bool = True) -> list[str]:
    state = await load_fleet_state(api.db)
    return [o.done for o in await keeper.keep(state, acting)]


async def test_a_group_grows_for_the_engines_and_shrinks_by_idle_machines_only(
    api: Api, moto: str
) -> None:
    await asyncio.to_thread(make_group, "grow", 1)
    hosts = await asyncio.to_thread(_hostnames, "grow")
    doc = _fleet("grow", hosts, replicas=20)  # 20 GPUs wanted: 3 machines of 8
    assert (await api.client.post("/v1/apply", json=doc)).status_code == 200
    keeper = PoolKeeper({"aws": AwsProvider()}, cooldown_s=0)
    assert await _keep(api, keeper, acting=False) == ["advised"]
    assert await asyncio.to_thread(_desired, "grow") == 1
    assert await _keep(api, keeper) == ["grown"]
    assert await asyncio.to_thread(_desired, "grow") == 3

    # three machines joined as nodes; the engines now want one machine's GPUs
    hosts = await asyncio.to_thread(_hostnames, "grow")
    doc = _fleet("grow", hosts, replicas=4)
    assert (await api.client.post("/v1/apply", json=doc)).status_code == 200
    assert await _keep(api, keeper) == ["shrunk"]
    assert await asyncio.to_thread(_desired, "grow") == 1
    state = await load_fleet_state(api.db)
    serving = {state.nodes[s.node].hostname for s in state.slots.values()}
    assert serving <= set(await asyncio.to_thread(_hostnames, "grow"))  # it kept the one serving


async def test_a_machine_that_serves_is_never_taken_and_a_pool_without_a_group_is_left_alone(
    api: Api, moto: str
) -> None:
    await asyncio.to_thread(make_group, "busy", 2)
    hosts = await asyncio.to_thread(_hostnames, "busy")
    doc = _fleet("busy", hosts, replicas=8)  # llama fills the first machine
    doc["models"] = [*doc["models"], {**doc["models"][0], "name": "qwen-7b"}]
    doc["deployments"].append(
        {"name": "qwen-east", "model": "qwen-7b", "region": "us-east", "replicas": 1}
    )  # and qwen's engine goes on the second
    assert (await api.client.post("/v1/apply", json=doc)).status_code == 200
    keeper = PoolKeeper({"aws": AwsProvider()}, cooldown_s=0)
    assert await _keep(api, keeper) == ["holds"]
    # two GPUs wanted now, one machine's worth; but each machine runs an engine still
    doc["deployments"][0]["replicas"] = 1
    assert (await api.client.post("/v1/apply", json=doc)).status_code == 200
    assert await _keep(api, keeper) == ["held"]
    assert await asyncio.to_thread(_desired, "busy") == 2

    alone = _fleet(None, hosts, replicas=1)
    alone["models"], alone["deployments"] = doc["models"], doc["deployments"]
    assert (await api.client.post("/v1/apply", json=alone)).status_code == 200
    assert await _keep(api, keeper) == []


def test_a_machine_and_its_node_match_by_address_or_by_a_names_first_label() -> None:
    # AWS names the machine by its private DNS name; its agent, by default, by the short one
    assert host_key("ip-10-0-1-23.ec2.internal") == host_key("IP-10-0-1-23")
    assert host_key("127.0.0.10") != host_key("127.0.0.11")  # addresses whole
    assert host_key("10.0.1.23") == "10.0.1.23"
    assert host_key(None) is None
