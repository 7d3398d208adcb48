"""The GCP and Azure capacity providers against recorded answers of their APIs (no emulator of
either exists to run here): the calls they make (method, path, query, body, token) and what
they read of the answers; a refusal is a ProviderError with what the cloud said; a group
named wrongly is refused before any call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.services.planner.providers.azure import AzureProvider
from controlplane.services.planner.providers.base import Machine, ProviderError
from controlplane.services.planner.providers.gcp import GcpProvider

RECORDED = Path(__file__).parent / "recorded"
GCP_GROUP = "acme-gpu/us-east4-a/east-h100-nodes"
GCP_URL = "/compute/v1/projects/acme-gpu/zones/us-east4-a/instanceGroupManagers/east-h100-nodes"
AZURE_GROUP = "0b1f6471-1bf0-4dda-aec3-111122223333/gpu/east-h100"
AZURE_URL = ("/subscriptions/0b1f6471-1bf0-4dda-aec3-111122223333/resourceGroups/gpu/providers/"
             "Microsoft.Compute/virtualMachineScaleSets/east-h100")  # fmt: skip


class Cloud:
    """Answers recorded per (method, path); every request kept."""

    def __init__(self, answers: dict[tuple[str, str], tuple[int, str]]) -> None:
        self.answers = answers
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        status, name = self.answers.get((request.method, request.url.path), (404, ""))
        body = json.loads((RECORDED / name).read_text()) if name else {"error": {}}
        return httpx.Response(status, json=body)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self))

    def calls(self) -> list[tuple[str, str, dict[str, str], Any]]:
        return [(r.method, r.url.path, dict(r.url.params),
                 json.loads(r.content) if r.content else None) for r in self.seen]  # fmt: skip


async def test_gcp_reads_resizes_and_deletes_one_named_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MERIDIAN_GCP_TOKEN", "ya29.recorded")
    cloud = Cloud({
        ("GET", GCP_URL): (200, "gcp_manager.json"),
        ("POST", f"{GCP_URL}/listManagedInstances"): (200, "gcp_managed_instances.json"),
        ("POST", f"{GCP_URL}/resize"): (200, "gcp_operation.json"),
        ("POST", f"{GCP_URL}/deleteInstances"): (200, "gcp_operation.json"),
    })  # fmt: skip
    provider = GcpProvider(cloud.client())
    group = await provider.read(GCP_GROUP)
    running = "https://www.googleapis.com/compute/v1/projects/acme-gpu/zones/us-east4-a/instances/east-h100-7xq2"
    assert group.desired == 2
    assert group.machines[0] == Machine(running, "running", "east-h100-7xq2")
    assert group.machines[1].state == "starting"
    await provider.resize(GCP_GROUP, 4)
    await provider.remove(GCP_GROUP, running)
    assert cloud.calls()[2:] == [
        ("POST", f"{GCP_URL}/resize", {"size": "4"}, None),
        ("POST", f"{GCP_URL}/deleteInstances", {}, {"instances": [running]}),
    ]
    assert {r.headers["authorization"] for r in cloud.seen} == {"Bearer ya29.recorded"}


async def test_azure_reads_resizes_and_deletes_one_named_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MERIDIAN_AZURE_TOKEN", "eyJ.recorded")
    cloud = Cloud({
        ("GET", AZURE_URL): (200, "azure_scale_set.json"),
        ("GET", f"{AZURE_URL}/virtualMachines"): (200, "azure_vms.json"),
        ("PATCH", AZURE_URL): (200, "azure_scale_set.json"),
        ("POST", f"{AZURE_URL}/delete"): (202, ""),
    })  # fmt: skip
    provider = AzureProvider(cloud.client())
    group = await provider.read(AZURE_GROUP)
    assert group.desired == 2
    assert group.machines == (Machine("0", "running", "east-h100000000"),
                              Machine("3", "starting", "east-h100000003"))  # fmt: skip
    await provider.resize(AZURE_GROUP, 3)
    await provider.remove(AZURE_GROUP, "0")
    version = {"api-version": "2024-07-01"}
    assert cloud.calls()[2:] == [
        ("PATCH", AZURE_URL, version, {"sku": {"capacity": 3}}),
        ("POST", f"{AZURE_URL}/delete", version, {"instanceIds": ["0"]}),
    ]


async def test_what_a_cloud_refuses_is_said_and_a_misnamed_group_is_refused_before_any_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MERIDIAN_GCP_TOKEN", "t")
    monkeypatch.setenv("MERIDIAN_AZURE_TOKEN", "t")
    missing = "/compute/v1/projects/acme-gpu/zones/us-east4-a/instanceGroupManagers/nowhere"
    cloud = Cloud({("GET", missing): (404, "gcp_not_found.json"),
                   ("GET", AZURE_URL.replace("east-h100", "nowhere")):
                       (404, "azure_not_found.json")})  # fmt: skip
    with pytest.raises(ProviderError, match=r"GCP: 404: The resource .* was not found"):
        await GcpProvider(cloud.client()).read("acme-gpu/us-east4-a/nowhere")
    with pytest.raises(ProviderError, match=r"Azure: 404: The Resource .* was not found"):
        await AzureProvider(cloud.client()).read(AZURE_GROUP.replace("east-h100", "nowhere"))
    before = len(cloud.seen)
    with pytest.raises(ProviderError, match="a GCP group is project/zone/manager"):
        await GcpProvider(cloud.client()).resize("east-h100-nodes", 2)
    with pytest.raises(ProviderError, match="an Azure group is subscription/resource-group"):
        await AzureProvider(cloud.client()).resize("gpu/east-h100", 2)
    assert len(cloud.seen) == before
