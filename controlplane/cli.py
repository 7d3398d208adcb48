"""`meridian controlplane ...`: migrate the database and serve the API."""

from __future__ import annotations

import asyncio
import logging

import click

from controlplane.db import migrate as migrations
from controlplane.db.engine import Database
from controlplane.db.provision import database_url
from controlplane.runtime import Replica
from controlplane.settings import Settings

log = logging.getLogger(__name__)


@click.group("controlplane")
def controlplane() -> None:
    """The central control plane."""


@controlplane.command("migrate")
@click.option("--downgrade-to", default=None, help="downgrade to this revision (base: empty)")
def migrate_command(downgrade_to: str | None) -> None:
    """Upgrade the database schema to the newest version."""
    settings = Settings()
    asyncio.run(_migrate(settings, downgrade_to))


async def _migrate(settings: Settings, downgrade_to: str | None) -> None:
    async with database_url(settings) as url:
        db = Database.connect(url, pool_size=1)
        try:
            if downgrade_to is None:
                await migrations.upgrade(db.engine)
            else:
                await migrations.downgrade(db.engine, downgrade_to)
            click.echo(f"schema at {await migrations.current(db.engine) or 'base'}")
        finally:
            await db.close()


@controlplane.command("serve")
@click.option("--host", default=None, help="address of the REST API [127.0.0.1]")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="REST port [8400]")
@click.option(
    "--grpc-port", type=click.IntRange(1, 65535), default=None, help="gRPC port for agents [8401]"
)
def serve_command(host: str | None, port: int | None, grpc_port: int | None) -> None:
    """Serve the admin REST API (and, for agents, gRPC)."""
    settings = Settings().with_overrides(host=host, port=port, grpc_port=grpc_port)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    asyncio.run(serve(settings))


async def serve(settings: Settings) -> None:
    async with database_url(settings) as url:
        db = Database.connect(url)
        try:
            await Replica(settings, db).serve()
        finally:
            await db.close()
