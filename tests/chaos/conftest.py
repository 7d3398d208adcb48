"""The chaos suite's fleet, shared by its scenarios in order (each heals what it broke), and
its report at the end of the run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.chaos.kit import REPORT, Fleet, chaos_fleet


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fleet(workdir: Path) -> AsyncIterator[Fleet]:
    async with chaos_fleet(workdir / "chaos") as started:
        yield started


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT:
        return
    columns = list(dict.fromkeys(key for row in REPORT for key in row))
    terminalreporter.section("chaos: what users saw while parts were killed")
    terminalreporter.write_line(" | ".join(columns))
    for row in REPORT:
        terminalreporter.write_line(" | ".join(str(row.get(c, "")) for c in columns))
