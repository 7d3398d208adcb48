"""A control-plane process with the example fleet applied, and agents to connect to it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from meridian.procs import stop_child
from tests.kits.controlplane import Server, start_server
from tests.kits.push import seed


@pytest_asyncio.fixture(loop_scope="session")
async def cp(database_url: str) -> AsyncIterator[Server]:
    """One replica, no etcd; short timeouts so that liveness shows within a test."""
    server = await start_server(database_url, heartbeat_timeout_s="2", node_down_after_s="1")
    try:
        await seed(server.url)
        yield server
    finally:
        await stop_child(server.process)
