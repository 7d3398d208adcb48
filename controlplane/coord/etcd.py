"""Coordination through etcd, with the aetcd client (asyncio, current grpcio and protobuf).

Keys, under the configured prefix (default /meridian):

    replicas/<id>   this replica's address, on its lease: it is alive while the key exists
    leader          the id of the replica that runs the singleton loops, on its lease
    revision        the newest committed revision; every replica watches it and pushes
    agents/<node>   which replica holds that node's agent stream, on that replica's lease

A replica that dies stops refreshing its lease; within `lease_ttl_s` its keys vanish, the
leader key with them, and another replica claims it. Nothing here is needed to rebuild
state: PostgreSQL holds the truth, and a replica that loses etcd re-creates its keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import aetcd

from controlplane.coord.base import (
    STEP_FAILED,
    AgentPresence,
    Coordinator,
    ReplicaInfo,
    logged_and_passed,
    own_cancel,
)
from controlplane.errors import CoordinationUnavailable

log = logging.getLogger(__name__)


class EtcdCoordinator(Coordinator):
    def __init__(
        self, me: ReplicaInfo, endpoints: list[tuple[str, int]], prefix: str, ttl_s: int
    ) -> None:
        super().__init__(me)
        self._endpoints = endpoints
        self._prefix = prefix.rstrip("/")
        self._ttl_s = ttl_s
        self._endpoint = 0
        self._client: Any = None
        self._lease: Any = None
        self._leader: str | None = None
        self._agents: dict[str, AgentPresence] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._ready = asyncio.Event()

    def _key(self, *parts: str) -> bytes:
        return "/".join((self._prefix, *parts)).encode()

    # --- life cycle ---------------------------------------------------------------

    async def start(self) -> None:
        await self._establish()
        self._tasks = [
            asyncio.create_task(self._keep_alive(), name="etcd-lease"),
            asyncio.create_task(self._campaign(), name="etcd-leader"),
            asyncio.create_task(self._watch_revisions(), name="etcd-revisions"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            with contextlib.suppress(Exception):
                if self._lease is not None:
                    await self._lease.revoke()  # leadership and presence go at once
            with contextlib.suppress(Exception):
                await self._client.close()

    async def _connect(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
        host, port = self._endpoints[self._endpoint % len(self._endpoints)]
        self._endpoint += 1
        self._client = aetcd.Client(host=host, port=port, timeout=max(2, self._ttl_s // 2))
        await self._client.connect()

    async def _establish(self) -> None:
        """A new lease, and every key this replica holds put on it again."""
        self._ready.clear()
        if self._client is None:
            await self._connect()
        self._lease = await self._client.lease(self._ttl_s)
        await self._client.put(
            self._key("replicas", self.me.id), json.dumps(self.me.as_json()).encode(), self._lease
        )
        for presence in list(self._agents.values()):
            await self._put_agent(presence)
        self._leader = None
        self._ready.set()
        log.info("etcd lease %x granted", self._lease.id, extra={"replica": self.me.id})

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            try:
                if not self._ready.is_set():
                    await self._establish()  # the last attempt failed: until one succeeds
                    continue
                reply = await self._lease.refresh()
                if reply is None or reply.TTL <= 0:
                    log.warning("etcd lease lost; taking a new one", extra={"replica": self.me.id})
                    await self._establish()
            except STEP_FAILED as exc:
                if own_cancel(exc):
                    raise
                log.exception("etcd unreachable; reconnecting")
                self._leader = None
                self._ready.clear()  # the campaign and the watch wait for a new lease
                await self._reconnect()

    async def _reconnect(self) -> None:
        try:
            await self._connect()
        except STEP_FAILED as exc:
            if own_cancel(exc):
                raise
            log.warning("etcd: could not connect yet (%s); trying again", exc)

    # --- leader -------------------------------------------------------------------

    async def _campaign(self) -> None:
        key = self._key("leader")
        while True:
            try:
                await self._ready.wait()
                tx = self._client.transactions
                won, _ = await self._client.transaction(
                    compare=[tx.version(key) == 0],
                    success=[tx.put(key, self.me.id.encode(), self._lease)],
                    failure=[],
                )
                current = await self._client.get(key)
                leader = current.value.decode() if current is not None else None
                if leader != self._leader:
                    log.info("leader is now %s", leader, extra={"replica": self.me.id})
                self._leader = leader
                if won:
                    log.info("this replica leads", extra={"replica": self.me.id})
            except STEP_FAILED as exc:
                if own_cancel(exc):
                    raise
                log.exception("leader election step failed")
                self._leader = None
            await asyncio.sleep(1.0)

    def is_leader(self) -> bool:
        return self._leader == self.me.id

    async def cluster(self) -> dict[str, Any]:
        try:
            found = await self._client.get_prefix(self._key("replicas", ""))
            leader = await self._client.get(self._key("leader"))
        except STEP_FAILED as exc:
            if own_cancel(exc):
                raise
            raise CoordinationUnavailable(f"etcd did not answer: {exc}") from exc
        replicas = sorted((json.loads(kv.value) for kv in found), key=lambda r: r["id"])
        return {
            "self": self.me.id,
            "leader": leader.value.decode() if leader is not None else None,
            "replicas": replicas,
        }

    # --- revisions ------------------------------------------------------------------

    async def publish_revision(self, revision: int) -> None:
        await self._heard(revision)
        with logged_and_passed(log, "could not announce revision %s through etcd", revision):
            await self._client.put(self._key("revision"), str(revision).encode())

    async def _watch_revisions(self) -> None:
        while True:
            with logged_and_passed(log, "watching revisions failed; watching again"):
                await self._ready.wait()
                watch = await self._client.watch(self._key("revision"))
                async for event in watch:
                    if event.kind == "PUT":
                        await self._heard(int(event.kv.value))
            await asyncio.sleep(0.5)

    # --- presence -------------------------------------------------------------------

    async def _put_agent(self, presence: AgentPresence) -> None:
        value = json.dumps(presence.as_json()).encode()
        await self._client.put(self._key("agents", presence.node), value, self._lease)

    async def agent_connected(self, presence: AgentPresence) -> None:
        self._agents[presence.node] = presence
        with logged_and_passed(log, "could not record agent %s in etcd", presence.node):
            await self._put_agent(presence)

    async def agent_disconnected(self, presence: AgentPresence) -> None:
        if self._agents.get(presence.node) != presence:
            return
        del self._agents[presence.node]
        key = self._key("agents", presence.node)
        tx = self._client.transactions
        with logged_and_passed(log, "could not remove agent %s from etcd", presence.node):
            await self._client.transaction(
                compare=[tx.value(key) == json.dumps(presence.as_json()).encode()],
                success=[tx.delete(key)],
                failure=[],
            )

    async def connected_agents(self) -> dict[str, AgentPresence]:
        found = await self._client.get_prefix(self._key("agents", ""))
        agents = (AgentPresence(**json.loads(kv.value)) for kv in found)
        return {a.node: a for a in agents}
