"""The local fleet's clouds (meridian/local_cloud.py): `meridian up` plays every cloud's groups
of machines on this one machine, and tells the control plane where in
`MERIDIAN_LOCAL_CLOUD_URL`, with `MERIDIAN_LOCAL_CLOUD_TOKEN`. Where it is set, every cloud's
pools are resized through it, whatever their provider: the fleet's GPUs are simulated, and so
are its clouds.

- read: `GET /groups?name=G` ({"desired": n, "machines": [{"id", "state", "hostname"}]});
- resize: `PUT /groups/desired?name=G` with {"desired": n};
- remove: `DELETE /groups/machines?name=G&machine=ID` (the group wants one fewer).

Its refusals are {"error": {"message": ...}}, as GCP's and Azure's are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from controlplane.services.planner.providers.base import Group, Machine
from controlplane.services.planner.providers.rest import Rest


def _static(token: str) -> Callable[[httpx.AsyncClient], Awaitable[str]]:
    async def token_of(http: httpx.AsyncClient) -> str:
        return token

    return token_of


class LocalProvider:
    def __init__(self, url: str, token: str, http: httpx.AsyncClient | None = None) -> None:
        self.url = url.rstrip("/")
        self.rest = Rest("the local cloud", _static(token), http)

    async def read(self, group: str) -> Group:
        doc = await self.rest.call("GET", f"{self.url}/groups", params={"name": group})
        machines = tuple(Machine(m["id"], m["state"], m.get("hostname"))
                         for m in doc.get("machines", []))  # fmt: skip
        return Group(int(doc["desired"]), machines)

    async def resize(self, group: str, desired: int) -> None:
        await self.rest.call("PUT", f"{self.url}/groups/desired", params={"name": group},
                             json={"desired": desired})  # fmt: skip

    async def remove(self, group: str, machine: str) -> None:
        await self.rest.call("DELETE", f"{self.url}/groups/machines",
                             params={"name": group, "machine": machine})  # fmt: skip
