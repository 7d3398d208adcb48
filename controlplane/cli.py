"""`meridian controlplane ...`: migrate the database and serve the API."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import click
from pydantic import ValidationError

from controlplane.db import migrate as migrations
from controlplane.db.engine import Database
from controlplane.db.provision import checked_schema, current_schema, database_url
from controlplane.errors import MeridianError
from controlplane.settings import Settings

log = logging.getLogger(__name__)


@click.group("controlplane")
def controlplane() -> None:
    """The central control plane."""


@controlplane.command("migrate")
@click.option("--downgrade-to", default=None, help="downgrade to this revision (base: empty)")
def migrate_command(downgrade_to: str | None) -> None:
    """Upgrade the database schema to the newest version."""
    settings = load_settings()
    _run(_migrate(settings, downgrade_to))


async def _migrate(settings: Settings, downgrade_to: str | None) -> None:
    async with database_url(settings) as url:
        db = Database.connect(url, pool_size=1)
        try:
            await current_schema(db, url)  # reachable, or one clear line
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
    settings = load_settings(host=host, port=port, grpc_port=grpc_port)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    # a line per call to a cloud's API (the planner's pools) says nothing a log needs
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    _run(serve(settings))


async def serve(settings: Settings) -> None:
    from controlplane.runtime import Replica  # the servers' libraries, once the checks pass

    async with database_url(settings) as url:
        db = Database.connect(url)
        try:
            await checked_schema(db, url, embedded=settings.database_url is None)
            await Replica(settings, db).serve()
        finally:
            await db.close()


def load_settings(**overrides: object) -> Settings:
    """The settings, or a usage error naming the variable that is wrong, in one line."""
    try:
        return Settings().with_overrides(**overrides)
    except ValidationError as error:
        raise click.UsageError(settings_problem(error)) from None


def settings_problem(error: ValidationError) -> str:
    first = error.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    if not first["loc"]:
        return message
    variable = f"MERIDIAN_{str(first['loc'][0]).upper()}"
    return message if message.startswith(variable) else f"{variable}: {message}"


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run a command; what it reports as an error ends it with one line and status 1 (the
    context managers it ran in, such as an embedded PostgreSQL, are closed first)."""
    try:
        asyncio.run(main)
    except MeridianError as error:
        raise click.ClickException(error.detail) from None
