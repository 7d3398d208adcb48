"""Azure virtual machine scale sets, through Azure Resource Manager (Microsoft.Compute,
api-version 2024-07-01). A group is named `subscription/resource-group/scale-set`. The token:
`MERIDIAN_AZURE_TOKEN`, else the machine's managed identity from its metadata service.

- read: `GET .../virtualMachineScaleSets/{s}` (its `sku.capacity`), and
  `GET .../virtualMachines` (each instance's id, provisioning state and computer name);
- resize: `PATCH` the scale set with `{"sku": {"capacity": N}}`;
- remove: `POST .../delete` with `{"instanceIds": [id]}`: the capacity goes down by one.

Tested against recorded answers of that API (no emulator of it exists); Terraform's module
(terraform/modules/nodepool-azure) ignores changes to the scale set's instance count.
"""

from __future__ import annotations

import httpx

from controlplane.services.planner.providers.base import Group, Machine, ProviderError
from controlplane.services.planner.providers.rest import Rest, metadata_token

API = "https://management.azure.com"
VERSION = {"api-version": "2024-07-01"}
TOKEN = metadata_token(
    "MERIDIAN_AZURE_TOKEN",
    "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2018-02-01"
    "&resource=https://management.azure.com/",
    {"Metadata": "true"},
)


def parse_group(group: str) -> str:
    """`subscription/resource-group/scale-set` as the API's URL of the scale set."""
    parts = group.split("/")
    if len(parts) != 3 or not all(parts):
        raise ProviderError(f"an Azure group is subscription/resource-group/scale-set, "
                            f"not {group!r}")  # fmt: skip
    subscription, resource_group, name = parts
    return (f"{API}/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{name}")  # fmt: skip


class AzureProvider:
    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self.rest = Rest("Azure", TOKEN, http)

    async def read(self, group: str) -> Group:
        url = parse_group(group)
        scale_set = await self.rest.call("GET", url, params=VERSION)
        listed = await self.rest.call("GET", f"{url}/virtualMachines", params=VERSION)
        machines = tuple(
            Machine(str(vm["instanceId"]), _state(vm.get("properties", {})),
                    vm.get("properties", {}).get("osProfile", {}).get("computerName"))
            for vm in listed.get("value", [])
        )  # fmt: skip
        return Group(int(scale_set["sku"]["capacity"]), machines)

    async def resize(self, group: str, desired: int) -> None:
        await self.rest.call("PATCH", parse_group(group), params=VERSION,
                             json={"sku": {"capacity": desired}})  # fmt: skip

    async def remove(self, group: str, machine: str) -> None:
        await self.rest.call("POST", f"{parse_group(group)}/delete", params=VERSION,
                             json={"instanceIds": [machine]})  # fmt: skip


def _state(properties: dict[str, str]) -> str:
    state = properties.get("provisioningState", "")
    if state == "Succeeded":
        return "running"
    if state in ("Deleting", "Failed"):
        return "stopping"
    return "starting"  # Creating, Updating
