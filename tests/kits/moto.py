"""moto's server, a real child process speaking AWS's API on loopback, with boto3 pointed at it
(AWS_ENDPOINT_URL and test credentials) for the test's duration."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from meridian.procs import free_port, stop_child
from tests.kits.push import eventually

REGION = "us-east-1"


@pytest_asyncio.fixture(loop_scope="session")
async def moto(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    port = free_port()
    server = Path(sys.executable).parent / "moto_server"
    proc = await asyncio.create_subprocess_exec(
        str(server), "-H", "127.0.0.1", "-p", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    async def up() -> bool:
        try:
            async with httpx.AsyncClient() as http:
                await http.get(f"{url}/moto-api/")
        except httpx.HTTPError:
            return False
        return True

    try:
        await eventually(up, within_s=30)
        for name, value in (("AWS_ENDPOINT_URL", url), ("AWS_ACCESS_KEY_ID", "testing"),
                            ("AWS_SECRET_ACCESS_KEY", "testing"),
                            ("AWS_DEFAULT_REGION", REGION)):  # fmt: skip
            monkeypatch.setenv(name, value)
        yield url
    finally:
        await stop_child(proc)
