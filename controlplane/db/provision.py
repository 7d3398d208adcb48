"""Which PostgreSQL to use: the one MERIDIAN_DATABASE_URL names, or an embedded one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from controlplane.db import migrate
from controlplane.db.embedded import EmbeddedPostgres
from controlplane.db.engine import Database
from controlplane.errors import DatabaseUnreachable, SchemaNotCurrent
from controlplane.settings import Settings


@asynccontextmanager
async def database_url(settings: Settings) -> AsyncIterator[str]:
    """Yield a database URL; an embedded server started here is stopped on the way out."""
    if settings.database_url:
        yield settings.database_url
        return
    embedded = EmbeddedPostgres(settings.data_dir / "postgres")
    credentials = await embedded.start()
    try:
        yield credentials.url()
    finally:
        await embedded.stop()


async def current_schema(db: Database, url: str) -> str | None:
    """The schema's migration; DatabaseUnreachable, in one line, when it cannot be read."""
    try:
        return await migrate.current(db.engine)
    except (DBAPIError, OSError) as error:
        where = make_url(url).render_as_string(hide_password=True)
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise DatabaseUnreachable(f"cannot reach PostgreSQL at {where}: {reason}") from None


async def checked_schema(db: Database, url: str, *, embedded: bool) -> None:
    """The schema at this code's head. An embedded database (the local fleet's own) is
    migrated here; an external one must be migrated by `meridian controlplane migrate`, a
    step of its own in a deployment, run once and not by every replica as it starts."""
    at = await current_schema(db, url)
    if at == migrate.head():
        return
    if embedded:
        await migrate.upgrade(db.engine)
        return
    found = f"at {at}" if at else "empty (never migrated)"
    raise SchemaNotCurrent(
        f"the database's schema is {found}; this version needs {migrate.head()}: "
        "run `meridian controlplane migrate` first"
    )
