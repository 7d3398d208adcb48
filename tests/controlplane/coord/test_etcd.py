"""One replica's coordinator against an etcd that stops answering for a while."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aetcd

from controlplane.coord.base import ReplicaInfo
from controlplane.coord.etcd import EtcdCoordinator
from meridian.procs import running_etcd
from tests.kits.push import eventually


async def test_etcd_frozen_then_back_the_replica_leads_and_hears_revisions_again(
    tmp_path: Path,
) -> None:
    """etcd freezes (SIGSTOP) long enough for a lease refresh to time out, so the replica
    reconnects, which closes the client its revision watch was open on (grpc then raises a
    CancelledError in the watch that no one asked for). Once etcd is back, the replica leads
    again and hears a revision another replica announces: no loop of it has ended."""
    async with running_etcd(tmp_path / "etcd") as (endpoint, process):
        host, port = endpoint.rsplit(":", 1)
        me = ReplicaInfo("r1", "http://127.0.0.1:1", "127.0.0.1:2", time.time())
        coordinator = EtcdCoordinator(me, [(host, int(port))], "/frozen", ttl_s=3)
        heard: list[int] = []

        async def listener(revision: int) -> None:
            heard.append(revision)

        coordinator.on_revision(listener)
        await coordinator.start()
        try:
            await eventually(_async(coordinator.is_leader), within_s=10)
            os.kill(process.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(5)  # a refresh (every 1 s) times out after 2 s
            finally:
                os.kill(process.pid, signal.SIGCONT)
            await eventually(_async(coordinator.is_leader), within_s=15)
            async with aetcd.Client(host=host, port=int(port)) as other:
                await other.put(b"/frozen/revision", b"42")  # as another replica announces

                async def heard_it() -> bool:
                    return 42 in heard

                await eventually(heard_it, within_s=10)
            assert not [t.get_name() for t in coordinator._tasks if t.done()]
        finally:
            await coordinator.stop()


def _async(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return check()

    return probe
