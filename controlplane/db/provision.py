"""Which PostgreSQL to use: the one MERIDIAN_DATABASE_URL names, or an embedded one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from controlplane.db.embedded import EmbeddedPostgres
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
