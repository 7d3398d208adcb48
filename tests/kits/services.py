"""The services the tests run on: a database statement, a scratch database per test (a copy
of the migrated template), a real etcd."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest

from controlplane.db.embedded import Credentials
from meridian import procs

TEMPLATE = "meridian_template"  # the migrated schema each test's database is a copy of
_counter = itertools.count()


async def sql(url: str, statement: str, timeout_s: float = 10) -> list[tuple[Any, ...]]:
    """One statement on its own connection, outside a transaction; the rows it returns."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=max(2, int(timeout_s))
    ) as conn:
        cursor = await conn.execute(statement.encode())
        return await cursor.fetchall() if cursor.description else []


@asynccontextmanager
async def scratch_database(
    postgres: Credentials, prefix: str, template: str | None
) -> AsyncIterator[str]:
    """A database for one test, dropped afterwards; a copy of `template` when given."""
    name = f"{prefix}_{os.getpid()}_{next(_counter)}"
    clause = f' TEMPLATE "{template}"' if template else ""
    await sql(postgres.url("postgres"), f'CREATE DATABASE "{name}"{clause}')
    try:
        yield postgres.url(name)
    finally:
        await sql(postgres.url("postgres"), f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def running_etcd(data_dir: Path) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """A real single-member etcd (Debian's etcd-server) on loopback: (host:port, process)."""
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not installed; ./scripts/test installs Debian's etcd-server")
    try:
        async with procs.running_etcd(data_dir) as running:
            yield running
    except click.ClickException as error:
        pytest.fail(error.message)
