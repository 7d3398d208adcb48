"""The schema comes from the migrations alone, and goes away with them."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from controlplane.db import migrate
from controlplane.db.engine import Database
from controlplane.db.rows import Base
from tests.kits.controlplane import run_cli
from tests.kits.services import sql


async def _tables(url: str) -> set[str]:
    rows = await sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {row[0] for row in rows}


async def test_upgrade_from_empty_then_downgrade(empty_database_url: str) -> None:
    db = Database.connect(empty_database_url, pool_size=1)
    try:
        assert await migrate.current(db.engine) is None
        await migrate.upgrade(db.engine)
        assert await migrate.current(db.engine) == migrate.head()
        tables = await _tables(empty_database_url)
        assert {"regions", "deployments", "audit_events", "config_revision"} <= tables

        await migrate.downgrade(db.engine, "base")
        assert await migrate.current(db.engine) is None
        assert await _tables(empty_database_url) == {"alembic_version"}

        await migrate.upgrade(db.engine)
        assert await migrate.current(db.engine) == migrate.head()
    finally:
        await db.close()


async def test_the_rows_match_the_migrations(database_url: str) -> None:
    def diff(sync: Connection) -> list[object]:
        return list(compare_metadata(MigrationContext.configure(sync), Base.metadata))

    db = Database.connect(database_url, pool_size=1)
    try:
        async with db.engine.connect() as conn:
            assert await conn.run_sync(diff) == []
    finally:
        await db.close()


async def test_migrate_command(empty_database_url: str) -> None:
    env = {"MERIDIAN_DATABASE_URL": empty_database_url}
    code, output = await run_cli("controlplane", "migrate", env=env)
    assert code == 0, output
    assert f"schema at {migrate.head()}" in output
    code, output = await run_cli("controlplane", "migrate", "--downgrade-to", "base", env=env)
    assert code == 0, output
    assert "schema at base" in output
    assert await _tables(empty_database_url) == {"alembic_version"}
