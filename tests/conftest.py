"""The harness: a real PostgreSQL for the whole session, a fresh database for every test.

PostgreSQL is started through the project's own EmbeddedPostgres (the machine's initdb and
pg_ctl). The schema is migrated once into a template; each test gets a copy of it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click
import psycopg
import pytest
import pytest_asyncio

import meridian  # noqa: F401  (before gRPC starts: its fork handlers off, as in every process)
from controlplane.db import migrate
from controlplane.db.embedded import UNSAFE_FAST, Credentials, EmbeddedPostgres
from controlplane.db.engine import Database
from meridian import procs
from tests import report
from tests.agents.agent_kit import stop_leftovers

TEMPLATE = "meridian_template"
IMMEDIATE = (
    "INSERT INTO rollout_policies (name, version, strategy, canary, waves, bake_s, checks) "
    "VALUES ('default', 1, 'immediate', 'node', '[]', 0, '{}')"
)
_counter = itertools.count()


@pytest_asyncio.fixture(scope="module", loop_scope="session", autouse=True)
async def _no_agent_outlives_its_module() -> AsyncIterator[None]:
    """A test that fails before it stops its agent (or an agent's engine) must not leave them
    holding ports for the next module's tests."""
    yield
    await stop_leftovers()


@pytest.fixture(scope="session")
def workdir() -> Iterator[Path]:
    """A scratch directory that the `postgres` user can reach when the tests run as root."""
    path = Path(tempfile.mkdtemp(prefix="meridian-tests-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def sql(url: str, statement: str, timeout_s: float = 10) -> list[tuple[Any, ...]]:
    """One statement on its own connection, outside a transaction; the rows it returns."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=max(2, int(timeout_s))
    ) as conn:
        cursor = await conn.execute(statement.encode())
        return await cursor.fetchall() if cursor.description else []


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def postgres(workdir: Path) -> AsyncIterator[Credentials]:
    server = EmbeddedPostgres(workdir / "postgres", server_settings=UNSAFE_FAST)
    credentials = await server.start()
    await sql(credentials.url("postgres"), f'CREATE DATABASE "{TEMPLATE}"')
    db = Database.connect(credentials.url(TEMPLATE), pool_size=1)
    await migrate.upgrade(db.engine)
    await db.close()
    # Tests of everything but rollouts see a change in force everywhere with its commit, as
    # an operator who declares `strategy: immediate` does; tests of rollouts drop this row
    # (`waved_database_url`) and get the default every fleet gets: waves.
    await sql(credentials.url(TEMPLATE), IMMEDIATE)
    yield credentials
    await server.stop()


@asynccontextmanager
async def _scratch_database(
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


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(postgres: Credentials) -> AsyncIterator[str]:
    """A database of its own for one test, migrated to head."""
    async with _scratch_database(postgres, "test", TEMPLATE) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def module_database_url(postgres: Credentials) -> AsyncIterator[str]:
    """A database of its own for a whole module, migrated to head: for a module whose
    processes start once for all its tests (the real SGLang's)."""
    async with _scratch_database(postgres, "module", TEMPLATE) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def waved_database_url(database_url: str) -> str:
    """A database of its own, migrated, where changes roll out by the default policy."""
    await sql(database_url, "DELETE FROM rollout_policies")
    return database_url


@pytest_asyncio.fixture(loop_scope="session")
async def empty_database_url(postgres: Credentials) -> AsyncIterator[str]:
    """A database with no schema at all."""
    async with _scratch_database(postgres, "empty", None) as url:
        yield url


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


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def etcd(workdir: Path) -> AsyncIterator[str]:
    """One etcd for the session; tests keep apart by each using a key prefix of its own."""
    async with running_etcd(workdir / "etcd") as (endpoint, _):
        yield endpoint


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The sections tests added to tests/report.py, after the run."""
    for title, lines in report.SECTIONS.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
