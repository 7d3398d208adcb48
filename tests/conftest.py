"""The harness: a real PostgreSQL for the whole session, a fresh database for every test.

PostgreSQL is started through the project's own EmbeddedPostgres (the machine's initdb and
pg_ctl). The schema is migrated once into a template; each test gets a copy of it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

import meridian  # noqa: F401  (before gRPC starts: its fork handlers off, as in every process)
from controlplane.db import migrate
from controlplane.db.embedded import UNSAFE_FAST, Credentials, EmbeddedPostgres
from controlplane.db.engine import Database
from tests import report as notes
from tests.kits.agents import stop_leftovers
from tests.kits.services import TEMPLATE, running_etcd, scratch_database, sql

IMMEDIATE = (
    "INSERT INTO rollout_policies (name, version, strategy, canary, waves, bake_s, checks) "
    "VALUES ('default', 1, 'immediate', 'node', '[]', 0, '{}')"
)


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


@pytest_asyncio.fixture(loop_scope="session")
async def database_url(postgres: Credentials) -> AsyncIterator[str]:
    """A database of its own for one test, migrated to head."""
    async with scratch_database(postgres, "test", TEMPLATE) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def module_database_url(postgres: Credentials) -> AsyncIterator[str]:
    """A database of its own for a whole module, migrated to head: for a module whose
    processes start once for all its tests (the real SGLang's)."""
    async with scratch_database(postgres, "module", TEMPLATE) as url:
        yield url


@pytest_asyncio.fixture(loop_scope="session")
async def waved_database_url(database_url: str) -> str:
    """A database of its own, migrated, where changes roll out by the default policy."""
    await sql(database_url, "DELETE FROM rollout_policies")
    return database_url


@pytest_asyncio.fixture(loop_scope="session")
async def empty_database_url(postgres: Credentials) -> AsyncIterator[str]:
    """A database with no schema at all."""
    async with scratch_database(postgres, "empty", None) as url:
        yield url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def etcd(workdir: Path) -> AsyncIterator[str]:
    """One etcd for the session; tests keep apart by each using a key prefix of its own."""
    async with running_etcd(workdir / "etcd") as (endpoint, _):
        yield endpoint


# The modules that take longest, longest first: pytest-xdist's workers (scripts/test) take
# modules in the order collected, so these start first and the run ends on short ones. An
# order only: a module not listed runs after them, as collected.
LONGEST_FIRST = (
    "chaos/test_chaos.py",
    "fleet/test_quotas.py",
    "fleet/test_rollouts.py",
    "agents/gateway/test_gateway.py",
    "fleet/test_escalation.py",
    "controlplane/test_fuzz.py",
    "controlplane/test_up.py",
    "fleet/test_hostile.py",
    "agents/gateway/test_quality.py",
    "controlplane/push/test_push.py",
    "fleet/test_quality.py",
    "agents/engines/test_supervisor.py",
    "controlplane/test_rbac.py",
    "agents/test_daemon.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):  # one process: the order written
        return
    tests = Path(__file__).parent
    rank = {str(tests / name): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """The lines the test added to tests/report.py go with its report (to xdist's
    controller too)."""
    made = yield
    made.user_properties.extend((notes.KEY, line) for line in notes.taken())
    return made


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    notes.collect(report.user_properties)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The sections tests added to tests/report.py, after the run."""
    for title, lines in notes.SECTIONS.items():
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)
