"""Alembic environment: runs on a connection handed in, or on MERIDIAN_DATABASE_URL."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from controlplane.db.engine import async_url
from controlplane.db.rows import Base
from controlplane.settings import Settings

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


async def _run_on_url(url: str) -> None:
    engine = create_async_engine(async_url(url))
    async with engine.connect() as connection:
        await connection.run_sync(_run)
        await connection.commit()
    await engine.dispose()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = Settings().database_url
    if url is None:
        raise SystemExit("set MERIDIAN_DATABASE_URL, or use `meridian controlplane migrate`")
    asyncio.run(_run_on_url(url))
