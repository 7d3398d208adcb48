"""A small HTTP service on loopback for a test: a cloud's metadata endpoint, say."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from meridian.procs import free_port


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """The app on a free loopback port while the block runs; its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
