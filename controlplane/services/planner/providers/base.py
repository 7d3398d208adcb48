"""What the planner asks of a cloud's group of machines (an AWS Auto Scaling group, a GCP
managed instance group, an Azure scale set): how many it wants and has, to want more, and to
let go of one machine it names (one whose node runs no engine), wanting one fewer.

A group is named as its cloud names it (see `parse_group` of each provider). Errors are
`ProviderError`, with what the cloud said: the planner audits them and tries again next
period, and nothing else changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class ProviderError(Exception):
    """The cloud refused or could not be reached; its message says which."""


@dataclass(frozen=True)
class Machine:
    id: str  # the cloud's own: an instance id, an instance's URL, a scale set's instance id
    state: str  # starting | running | stopping
    hostname: str | None = None  # the name its node's agent registers with, where known


@dataclass(frozen=True)
class Group:
    desired: int
    machines: tuple[Machine, ...]

    @property
    def running(self) -> int:
        return sum(1 for m in self.machines if m.state == "running")


class Provider(Protocol):
    async def read(self, group: str) -> Group: ...

    async def resize(self, group: str, desired: int) -> None: ...

    async def remove(self, group: str, machine: str) -> None:
        """That machine goes, and the group wants one fewer (it is not replaced)."""
        ...
