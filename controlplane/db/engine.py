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

# The spellings of a PostgreSQL URL that operators and other tools use; all mean the same
# database, reached here through psycopg 3.
SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+asyncpg",
           "postgresql+psycopg2", "postgresql+psycopg_async")  # fmt: skip


def url_problem(url: str) -> str | None:
    """Why `url` is not a PostgreSQL URL that Meridian can use; None when it is."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        return f"must be a postgresql:// URL (or {', '.join(s + '://' for s in SCHEMES[1:])})"
    try:
        parsed = make_url(f"postgresql://{rest}")
    except ValueError as error:
        return f"cannot be parsed: {error}"
    if not parsed.host and not parsed.query.get("host"):
        return "names no host"
    return None


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
