"""The AWS capacity provider against moto's server, a real child process speaking AWS's API:
it reads an Auto Scaling group (desired count, instances, their private DNS names), resizes
it, and lets one named instance go with the group wanting one fewer; a group that does not
exist is a clear error."""

from __future__ import annotations

import asyncio

import boto3
import pytest

from controlplane.services.planner.providers.aws import AwsProvider
from controlplane.services.planner.providers.base import ProviderError
from tests.kits.moto import REGION, moto

GROUP = f"{REGION}/east-h100"  # as a node pool's `group` names it
__all__ = ["moto"]  # the fixture


def make_group(name: str, desired: int) -> None:
    """What Terraform's nodepool-aws module makes: a launch template and a group."""
    ec2 = boto3.client("ec2", region_name=REGION)
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    template = {"ImageId": image, "InstanceType": "p5.48xlarge"}
    ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=template)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name, MinSize=0, MaxSize=4, DesiredCapacity=desired,
        LaunchTemplate={"LaunchTemplateName": name}, AvailabilityZones=[f"{REGION}a"],
    )  # fmt: skip


async def test_a_group_is_read_resized_and_lets_an_idle_machine_go(moto: str) -> None:
    await asyncio.to_thread(make_group, "east-h100", 2)
    provider = AwsProvider()
    group = await provider.read(GROUP)
    assert group.desired == 2
    assert group.running == 2
    assert all(m.hostname and m.hostname.startswith("ip-") for m in group.machines)

    await provider.resize(GROUP, 4)
    group = await provider.read(GROUP)
    assert (group.desired, len(group.machines)) == (4, 4)

    idle = group.machines[-1].id
    await provider.remove(GROUP, idle)
    group = await provider.read(GROUP)
    assert group.desired == 3
    assert idle not in {m.id for m in group.machines if m.state != "stopping"}


async def test_a_group_that_does_not_exist_is_a_clear_error(moto: str) -> None:
    provider = AwsProvider()
    with pytest.raises(ProviderError, match="no Auto Scaling group named 'nowhere' in us-east-1"):
        await provider.read(f"{REGION}/nowhere")
    with pytest.raises(ProviderError, match="AWS: "):
        await provider.resize(f"{REGION}/nowhere", 3)
    with pytest.raises(ProviderError, match="an AWS group is aws-region/group-name"):
        await provider.read("nowhere")
