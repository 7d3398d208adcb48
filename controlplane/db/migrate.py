"""Programmatic Alembic: upgrade, downgrade and the current revision, on an async engine."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(engine: AsyncEngine, target: str = "head") -> None:
    await _with_connection(engine, lambda cfg: command.upgrade(cfg, target))


async def downgrade(engine: AsyncEngine, target: str = "base") -> None:
    await _with_connection(engine, lambda cfg: command.downgrade(cfg, target))


async def current(engine: AsyncEngine) -> str | None:
    async with engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: MigrationContext.configure(sync).get_current_revision()
        )


async def _with_connection(engine: AsyncEngine, action: object) -> None:
    def run(sync: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = sync
        action(config)  # type: ignore[operator]

    async with engine.begin() as conn:
        await conn.run_sync(run)
