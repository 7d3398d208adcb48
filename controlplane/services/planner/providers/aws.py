"""AWS Auto Scaling groups, through boto3 (its credentials from the environment, as boto3 finds
them; `AWS_ENDPOINT_URL` points it elsewhere, as the tests point it at moto). A group is named
`aws-region/group-name`.

- read: `DescribeAutoScalingGroups` (desired capacity, instances and their lifecycle state),
  and `DescribeInstances` for the instances' private DNS names, which their agents register
  with;
- resize: `SetDesiredCapacity` (HonorCooldown false: the planner keeps its own);
- remove: `TerminateInstanceInAutoScalingGroup` with ShouldDecrementDesiredCapacity.

The Terraform module (terraform/modules/nodepool-aws) ignores changes to the group's desired
capacity, so that a later plan does not undo the planner's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from controlplane.services.planner.providers.base import Group, Machine, ProviderError

STATES = {"Pending": "starting", "Pending:Wait": "starting", "Pending:Proceed": "starting",
          "InService": "running"}  # fmt: skip  # the rest: stopping (terminating, detaching...)


def parse_group(group: str) -> tuple[str, str]:
    """`aws-region/group-name`: the AWS region and the Auto Scaling group's name."""
    region, _, name = group.partition("/")
    if not region or not name:
        raise ProviderError(f"an AWS group is aws-region/group-name, not {group!r}")
    return region, name


class AwsProvider:
    def __init__(self) -> None:
        self._clients: dict[tuple[str, str], Any] = {}  # (service, AWS region): its client

    def _client(self, service: str, region: str) -> Any:
        key = (service, region)
        if key not in self._clients:
            self._clients[key] = boto3.client(service, region_name=region)
        return self._clients[key]

    async def read(self, group: str) -> Group:
        region, name = parse_group(group)
        found = await _call(self._client("autoscaling", region).describe_auto_scaling_groups,
                            AutoScalingGroupNames=[name])  # fmt: skip
        groups = found.get("AutoScalingGroups", [])
        if not groups:
            raise ProviderError(f"no Auto Scaling group named {name!r} in {region}")
        made = groups[0]
        ids = [i["InstanceId"] for i in made.get("Instances", [])]
        names = await self._hostnames(region, ids)
        machines = tuple(
            Machine(i["InstanceId"], STATES.get(i.get("LifecycleState", ""), "stopping"),
                    names.get(i["InstanceId"]))
            for i in made.get("Instances", [])
        )  # fmt: skip
        return Group(int(made["DesiredCapacity"]), machines)

    async def resize(self, group: str, desired: int) -> None:
        region, name = parse_group(group)
        await _call(self._client("autoscaling", region).set_desired_capacity,
                    AutoScalingGroupName=name, DesiredCapacity=desired,
                    HonorCooldown=False)  # fmt: skip

    async def remove(self, group: str, machine: str) -> None:
        region, _ = parse_group(group)
        await _call(self._client("autoscaling", region).terminate_instance_in_auto_scaling_group,
                    InstanceId=machine, ShouldDecrementDesiredCapacity=True)  # fmt: skip

    async def _hostnames(self, region: str, ids: list[str]) -> dict[str, str]:
        if not ids:
            return {}
        found = await _call(self._client("ec2", region).describe_instances, InstanceIds=ids)
        return {i["InstanceId"]: i.get("PrivateDnsName") or i.get("PrivateIpAddress", "")
                for r in found.get("Reservations", []) for i in r.get("Instances", [])}  # fmt: skip


async def _call(method: Any, **params: Any) -> dict[str, Any]:
    """boto3 blocks: off the loop, its errors as ProviderError."""
    try:
        answer: dict[str, Any] = await asyncio.to_thread(method, **params)
    except ClientError as error:
        said = error.response.get("Error", {}).get("Message", error)
        raise ProviderError(f"AWS: {said}") from error
    except (BotoCoreError, ResponseParserError) as error:  # an answer that is not AWS's
        raise ProviderError(f"AWS: {error}") from error
    return answer
