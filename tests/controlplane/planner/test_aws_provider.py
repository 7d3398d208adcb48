"""The AWS capacity provider against moto's server, a real child process speaking AWS's API:
it reads an Auto Scaling group (desired count, instances, their private DNS names), resizes
it, and lets one named instance go with the group wanting one fewer; a group that does not
exist is a clear error."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import boto3
import httpx
import pytest
import pytest_asyncio

from controlplane.services.planner.providers.aws import AwsProvider
from controlplane.services.planner.providers.base import ProviderError
from meridian.procs import free_port, stop_child
from tests.kits.push import eventually

REGION = "us-east-1"
GROUP = f"{REGION}/east-h100"  # as a node pool's `group` names it


@pytest_asyncio.fixture(loop_scope="session")
async def moto(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    port = free_port()
    server = Path(sys.executable).parent / "moto_server"
    proc = await asyncio.create_subprocess_exec(
        str(server), "-H", "127.0.0.1", "-p", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    async def up() -> bool:
        try:
            async with httpx.AsyncClient() as http:
                await http.get(f"{url}/moto-api/")
        except httpx.HTTPError:
            return False
        return True

    try:
        await eventually(up, within_s=30)
        for name, value in (("AWS_ENDPOINT_URL", url), ("AWS_ACCESS_KEY_ID", "testing"),
                            ("AWS_SECRET_ACCESS_KEY", "testing"),
                            ("AWS_DEFAULT_REGION", REGION)):  # fmt: skip
            monkeypatch.setenv(name, value)
        yield url
    finally:
        await stop_child(proc)


def _group(name: str, desired: int) -> None:
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
    await asyncio.to_thread(_group, "east-h100", 2)
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
