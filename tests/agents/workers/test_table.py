"""The worker table as the router reads it: what makes a worker serve."""

from __future__ import annotations

from agents.router.router import Router
from agents.workers.table import WorkerTable
from tests.kits.router import MODEL, config_of


def test_a_local_engine_serves_the_moment_its_supervisor_finds_it_ready() -> None:
    """Before any load poll has answered: the supervisor's health check is proof of reach."""
    config = config_of("cost", workers=1)
    table = WorkerTable()
    table.replace(config.workers)
    router = Router(table)
    router.configure(config)
    route, request = config.routes[MODEL], router.request(MODEL, b"hello")

    table.set_engine_state("w0", "starting")
    starting = router.route(route, request, set())
    table.set_engine_state("w0", "ready")
    ready = router.route(route, request, set())
    table.set_engine_state("w0", "draining")
    draining = router.route(route, request, set())

    assert (starting.ranked, starting.unavailable) == ([], 1)
    assert [c.worker.id for c in ready.ranked] == ["w0"]
    assert (draining.ranked, draining.unavailable) == ([], 1)
