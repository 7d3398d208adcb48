"""What the replicas coordinate, behind one interface: in-process alone, or through etcd."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from controlplane.settings import Settings

RevisionListener = Callable[[int], Awaitable[None]]


STEP_FAILED = (Exception, asyncio.CancelledError)


def own_cancel(exc: BaseException) -> bool:
    """Whether `exc` is this task's own cancellation, to let through. grpc's aio raises a
    CancelledError no one asked for in every call still open on a channel that is closed (as
    the etcd client's is on a reconnect): a loop that must go on catches STEP_FAILED and
    treats that one as a failed step."""
    task = asyncio.current_task()
    return isinstance(exc, asyncio.CancelledError) and (task is None or task.cancelling() > 0)


@contextlib.contextmanager
def logged_and_passed(log: logging.Logger, message: str, *args: object) -> Iterator[None]:
    """A step of a loop that must go on: its failure (a stray CancelledError included) is
    logged and passed over; the task's own cancellation goes through."""
    try:
        yield
    except STEP_FAILED as exc:
        if own_cancel(exc):
            raise
        log.exception(message, *args)


def new_replica_id() -> str:
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class ReplicaInfo:
    id: str
    rest_url: str
    grpc_address: str
    started_at: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def replica_info(settings: Settings) -> ReplicaInfo:
    host = settings.advertise_host or settings.host
    return ReplicaInfo(
        id=settings.replica_id or new_replica_id(),
        rest_url=f"http://{host}:{settings.port}",
        grpc_address=f"{host}:{settings.grpc_port}",
        started_at=time.time(),
    )


@dataclass(frozen=True)
class AgentPresence:
    node: str
    region: str
    replica: str
    stream: str  # which stream of the agent; a stale stream's goodbye must not erase a new one
    since: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class Coordinator(abc.ABC):
    """Leader election, revision fan-out and presence for one replica."""

    def __init__(self, me: ReplicaInfo) -> None:
        self.me = me
        self._revision_listeners: list[RevisionListener] = []

    def on_revision(self, listener: RevisionListener) -> None:
        """Called with every revision another replica (or this one) committed."""
        self._revision_listeners.append(listener)

    async def _heard(self, revision: int) -> None:
        for listener in self._revision_listeners:
            await listener(revision)

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def publish_revision(self, revision: int) -> None: ...

    @abc.abstractmethod
    def is_leader(self) -> bool: ...

    @abc.abstractmethod
    async def cluster(self) -> dict[str, Any]:
        """{"self": id, "leader": id or None, "replicas": [...]}"""

    @abc.abstractmethod
    async def agent_connected(self, presence: AgentPresence) -> None: ...

    @abc.abstractmethod
    async def agent_disconnected(self, presence: AgentPresence) -> None: ...

    @abc.abstractmethod
    async def connected_agents(self) -> dict[str, AgentPresence]:
        """Every agent that holds a stream to any replica, by node."""


class LocalCoordinator(Coordinator):
    """One replica and no etcd: it leads, and presence is its own memory."""

    def __init__(self, me: ReplicaInfo) -> None:
        super().__init__(me)
        self._agents: dict[str, AgentPresence] = {}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def publish_revision(self, revision: int) -> None:
        await self._heard(revision)

    def is_leader(self) -> bool:
        return True

    async def cluster(self) -> dict[str, Any]:
        return {"self": self.me.id, "leader": self.me.id, "replicas": [self.me.as_json()]}

    async def agent_connected(self, presence: AgentPresence) -> None:
        self._agents[presence.node] = presence

    async def agent_disconnected(self, presence: AgentPresence) -> None:
        if self._agents.get(presence.node) == presence:
            del self._agents[presence.node]

    async def connected_agents(self) -> dict[str, AgentPresence]:
        return dict(self._agents)
