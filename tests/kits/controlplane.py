"""Fixtures for the control plane: its API in-process, and as a real server process."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest_asyncio

from controlplane.api.app import create_app
from controlplane.db.engine import Database
from controlplane.settings import Settings
from meridian.procs import ControlPlane, start_control_plane, stop_child

ADMIN_TOKEN = "test-admin-token-0123456789abcdef"


def kek_file(database_url: str) -> str:
    """The key file (MERIDIAN_KMS_KEY_FILE) of the control planes of one test database: its
    replicas, and an API in-process beside them, share it as a deployment's replicas would."""
    name = database_url.rsplit("/", 1)[-1].split("?")[0]
    return str(Path(tempfile.gettempdir()) / "meridian-test-keks" / f"{name}.json")


@dataclass
class Api:
    """An HTTP client bound to the control plane, authenticated as the bootstrap admin."""

    client: httpx.AsyncClient
    db: Database

    def as_(self, token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def create(self, plural: str, body: dict[str, Any], token: str = ADMIN_TOKEN) -> Any:
        response = await self.client.post(f"/v1/{plural}", json=body, headers=self.as_(token))
        assert response.status_code == 201, response.text
        return response.json()

    async def revision(self) -> int:
        response = await self.client.get("/v1/revision", headers=self.as_(ADMIN_TOKEN))
        return int(response.json()["revision"])


@pytest_asyncio.fixture(loop_scope="session")
async def api(database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """The API application over an in-process ASGI transport, on a fresh database; its local
    state (tenants' files) in the test's directory."""
    settings = Settings(database_url=database_url, admin_token=ADMIN_TOKEN, data_dir=tmp_path,
                        kms_key_file=Path(kek_file(database_url)))  # fmt: skip
    db = Database.connect(database_url, pool_size=4)
    app = create_app(settings, db)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://controlplane",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as client:
        yield Api(client, db)
    await db.close()


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `meridian ARGS` as a child process; its exit code and its output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "meridian",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, output.decode()


Server = ControlPlane


async def start_server(database_url: str, host: str = "127.0.0.1", **env: str) -> Server:
    """`meridian controlplane serve` as a real child process; MERIDIAN_* settings in `env`
    (`port` and `grpc_port` as its flags: the ports are known before it starts)."""
    grpc_port = int(env.pop("grpc_port")) if "grpc_port" in env else None
    port = int(env.pop("port")) if "port" in env else None
    settings = {
        "MERIDIAN_DATABASE_URL": database_url,
        "MERIDIAN_ADMIN_TOKEN": ADMIN_TOKEN,
        "MERIDIAN_LOG_LEVEL": "warning",
        "MERIDIAN_KMS_KEY_FILE": kek_file(database_url),
        **{f"MERIDIAN_{key.upper()}": value for key, value in env.items()},
    }
    return await start_control_plane(settings, host=host, port=port, grpc_port=grpc_port,
                                     timeout_s=30)  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session")
async def server(database_url: str) -> AsyncIterator[Server]:
    """`meridian controlplane serve` as a real child process on a fresh database."""
    started = await start_server(database_url)
    try:
        yield started
    finally:
        await stop_child(started.process)
