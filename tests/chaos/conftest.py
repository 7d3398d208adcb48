"""The chaos suite's fleet, shared by its scenarios in order (each heals what it broke)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from tests.chaos.kit import Fleet, chaos_fleet


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet(workdir: Path) -> AsyncIterator[Fleet]:
    async with chaos_fleet(workdir / "chaos") as started:
        yield started
