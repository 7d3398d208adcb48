"""GCP managed instance groups, through the Compute Engine API (v1). A group is named
`project/zone/manager`. The token: `MERIDIAN_GCP_TOKEN`, else the instance's service account
from the metadata server.

- read: `GET .../instanceGroupManagers/{m}` (its `targetSize`), and
  `POST .../listManagedInstances` (each instance's URL, status and current action);
- resize: `POST .../resize?size=N`;
- remove: `POST .../deleteInstances` with the instance's URL: the group's target size
  goes down by one.

Tested against recorded answers of that API (no emulator of it exists); Terraform's module
(terraform/modules/nodepool-gcp) ignores changes to the group's target size.
"""

from __future__ import annotations

import httpx

from controlplane.services.planner.providers.base import Group, Machine, ProviderError
from controlplane.services.planner.providers.rest import Rest, metadata_token

API = "https://compute.googleapis.com/compute/v1"
TOKEN = metadata_token(
    "MERIDIAN_GCP_TOKEN",
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token",
    {"Metadata-Flavor": "Google"},
)
STARTING = {"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "VERIFYING"}
STOPPING = {"DELETING", "ABANDONING"}


def parse_group(group: str) -> str:
    """`project/zone/manager` as the API's URL of the manager."""
    parts = group.split("/")
    if len(parts) != 3 or not all(parts):
        raise ProviderError(f"a GCP group is project/zone/manager, not {group!r}")
    project, zone, manager = parts
    return f"{API}/projects/{project}/zones/{zone}/instanceGroupManagers/{manager}"


class GcpProvider:
    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self.rest = Rest("GCP", TOKEN, http)

    async def read(self, group: str) -> Group:
        url = parse_group(group)
        manager = await self.rest.call("GET", url)
        listed = await self.rest.call("POST", f"{url}/listManagedInstances")
        machines = tuple(
            Machine(m["instance"], _state(m), m["instance"].rsplit("/", 1)[-1])
            for m in listed.get("managedInstances", [])
        )
        return Group(int(manager["targetSize"]), machines)

    async def resize(self, group: str, desired: int) -> None:
        await self.rest.call("POST", f"{parse_group(group)}/resize", params={"size": desired})

    async def remove(self, group: str, machine: str) -> None:
        await self.rest.call("POST", f"{parse_group(group)}/deleteInstances",
                             json={"instances": [machine]})  # fmt: skip


def _state(managed: dict[str, str]) -> str:
    action = managed.get("currentAction", "NONE")
    if action in STOPPING:
        return "stopping"
    if action in STARTING or managed.get("instanceStatus") != "RUNNING":
        return "starting"
    return "running"
