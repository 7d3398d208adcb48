"""The local fleet's load balancers: each region's `gateway_url` is a TCP balancer in front of
the region's agents, as a cloud's load balancer is in front of a pool's machines (the
Terraform pool modules make one). Clients and peer regions reach the region there, whichever
of its machines the planner grows, lets go, or a preemption takes.

Each connection goes to the next agent in turn that accepts it within a second; one whose
agent is gone is tried on the next. It is layer 4 only: a connection stays with the agent
that took it, as with a cloud's network load balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 1.0
CHUNK = 64 * 1024


class Balancer:
    def __init__(self, region: str, backends: Callable[[], list[tuple[str, int]]]) -> None:
        self.region = region
        self.backends = backends  # the region's agents now: (host, port)
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._open):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._open.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backends = self.backends()
        start = next(self._turn)
        for i in range(len(backends)):
            host, port = backends[(start + i) % len(backends)]
            try:
                async with asyncio.timeout(CONNECT_TIMEOUT_S):
                    up_reader, up_writer = await asyncio.open_connection(host, port)
            except (OSError, TimeoutError):
                continue
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.close()
            return
        log.warning("region %s: no agent takes connections", self.region)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes from one side to the other until either ends; the other is then half-closed."""
    with contextlib.suppress(OSError):
        while chunk := await source.read(CHUNK):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
