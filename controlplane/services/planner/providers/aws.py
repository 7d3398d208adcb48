"""AWS Auto Scaling groups, through boto3 (its credentials and region from the environment, as
boto3 finds them; `AWS_ENDPOINT_URL` points it elsewhere, as the tests point it at moto).

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


class AwsProvider:
    def __init__(self, region: str | None = None) -> None:
        self._autoscaling = boto3.client("autoscaling", region_name=region)
        self._ec2 = boto3.client("ec2", region_name=region)

    async def read(self, group: str) -> Group:
        found = await _call(self._autoscaling.describe_auto_scaling_groups,
                            AutoScalingGroupNames=[group])  # fmt: skip
        groups = found.get("AutoScalingGroups", [])
        if not groups:
            raise ProviderError(f"no Auto Scaling group named {group!r}")
        made = groups[0]
        ids = [i["InstanceId"] for i in made.get("Instances", [])]
        names = await self._hostnames(ids)
        machines = tuple(
            Machine(i["InstanceId"], STATES.get(i.get("LifecycleState", ""), "stopping"),
                    names.get(i["InstanceId"]))
            for i in made.get("Instances", [])
        )  # fmt: skip
        return Group(int(made["DesiredCapacity"]), machines)

    async def resize(self, group: str, desired: int) -> None:
        await _call(self._autoscaling.set_desired_capacity, AutoScalingGroupName=group,
                    DesiredCapacity=desired, HonorCooldown=False)  # fmt: skip

    async def remove(self, group: str, machine: str) -> None:
        await _call(self._autoscaling.terminate_instance_in_auto_scaling_group,
                    InstanceId=machine, ShouldDecrementDesiredCapacity=True)  # fmt: skip

    async def _hostnames(self, ids: list[str]) -> dict[str, str]:
        if not ids:
            return {}
        found = await _call(self._ec2.describe_instances, InstanceIds=ids)
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
