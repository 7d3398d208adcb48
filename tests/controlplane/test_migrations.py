"""The schema comes from the migrations alone, and goes away with them."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from controlplane.db import migrate
from controlplane.db.engine import Database
from controlplane.db.rows import Base
from controlplane.services.usage.store import UsageStore
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


async def test_the_ledger_s_sums_are_made_again_by_quarter_hour(empty_database_url: str) -> None:
    """0025 sums the records already stored by quarter hour (usage_quarters), in place of
    the hourly sums; going back sums them by hour again."""
    url = empty_database_url
    db = Database.connect(url, pool_size=1)
    try:
        await migrate.upgrade(db.engine, "0024")
        await UsageStore(db)._partitions({(2026, 11)})
        for n, (minute, kind) in enumerate(((5, "served"), (20, "served"), (50, "refused"),
                                            (55, "hop"))):  # fmt: skip
            values = (f"('r{n}', '2026-11-28 10:{minute:02d}+00', '2026-11-28 10:{minute:02d}"
                      f"+00', 'r{n}', '{kind}', 'acme', '', 'm', 'm', 'eu-west', 'n1', "
                      "'standard', 100, 0, 10, 'ok', 200, '', '', 7)")  # fmt: skip
            await sql(url, "INSERT INTO usage_records (id, started_at, ended_at, request_id, "  # noqa: S608
                      "kind, tenant, api_key, model, answered_model, region, node, "
                      "service_class, prompt_tokens, cached_tokens, completion_tokens, outcome, "
                      f"status, came_from, escalated_to, cost_nanos) VALUES {values}")  # fmt: skip
        await migrate.upgrade(db.engine)
        quarters = await sql(url, "SELECT to_char(at AT TIME ZONE 'UTC', 'HH24:MI'), "
                             "requests, refused, prompt_tokens, cost_nanos FROM usage_quarters "
                             "ORDER BY at")  # fmt: skip
        assert quarters == [("10:00", 1, 0, 100, 7), ("10:15", 1, 0, 100, 7),
                            ("10:45", 0, 1, 100, 7)]  # fmt: skip
        await migrate.downgrade(db.engine, "0024")
        hours = await sql(url, "SELECT requests, refused, prompt_tokens FROM usage_hours")
        assert hours == [(2, 1, 300)]
    finally:
        await db.close()
