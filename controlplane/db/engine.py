"""The async engine and session factory for one database URL."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)


def async_url(url: str) -> str:
    """The URL with the psycopg driver, whatever spelling of PostgreSQL's it came in."""
    _, _, rest = url.partition("://")
    parsed = make_url(f"postgresql://{rest}")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


@dataclass
class Database:
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 10) -> Database:
        engine = create_async_engine(async_url(url), pool_size=pool_size, pool_pre_ping=True)
        return cls(
            engine=engine,
            sessions=async_sessionmaker(engine, expire_on_commit=False, autoflush=False),
        )

    async def close(self) -> None:
        await self.engine.dispose()
