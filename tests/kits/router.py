"""A router over a worker table it is handed, with no engine: for the router's tests."""

from __future__ import annotations

from typing import Any

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.config import RegionConfig, RouteConfig, compile_config
from agents.router.admission import Admission
from agents.router.plan import Ask, Local, Placement, Plan, Progress, Refusal, Reject
from agents.router.policies import RouteRequest
from agents.router.router import Router
from agents.workers.table import EngineLoad, WorkerTable

MODEL = "m"
SYSTEM = ("you are a careful assistant who answers in full sentences. " * 40).encode()


def config_of(
    policy: str, workers: int = 2, itl_ms: int | None = None, params: dict[str, Any] | None = None
) -> RegionConfig:
    route = pb.Route(model=MODEL, policy=policy, slo_itl_ms=itl_ms)
    route.params.update(params or {})
    snapshot = pb.Snapshot(
        revision=1,
        region=pb.RegionInfo(name="r", cloud="c", jurisdiction="us"),
        models=[pb.ModelInfo(name=MODEL, context_length=100_000)],
        workers=[
            pb.Worker(id=f"w{i}", model=MODEL, deployment="d", role="unified",
                      url=f"http://127.0.0.1:{30000 + i}")
            for i in range(workers)
        ],
        routes=[route],
    )  # fmt: skip
    return compile_config(snapshot)


def router_of(
    policy: str,
    workers: int = 2,
    itl_ms: int | None = None,
    params: dict[str, Any] | None = None,
    clock: list[float] | None = None,
) -> tuple[Router, RegionConfig, WorkerTable]:
    clock = clock if clock is not None else [0.0]
    table = WorkerTable(clock=lambda: clock[0])
    config = config_of(policy, workers, itl_ms, params)
    table.replace(config.workers)
    for worker in config.workers:
        table.polled(worker.id, EngineLoad(max_total_tokens=100_000), fail_after=2)
    router = Router(table, clock=lambda: clock[0])
    router.configure(config)
    return router, config, table


def send(router: Router, config: RegionConfig, key: bytes) -> str:
    request = router.request(MODEL, key)
    decision = router.route(config.routes[MODEL], request, set())
    chosen = decision.ranked[0]
    router.dispatched(chosen, request)
    return chosen.worker.id


def ticking_admission(router: Router, clock: list[float]) -> Admission:
    """Admission on the router's clock, which moves on 0.1 s each time it is read."""

    def ticking() -> float:
        clock[0] += 0.1
        return clock[0]

    return Admission(router, clock=ticking)


async def plan_of(
    admission: Admission, route: RouteConfig, request: RouteRequest, since: float
) -> Plan:
    """Admission's plan for a request of a tenant without a fallback rule."""
    placement = Placement(MODEL, route, request, None)
    return await admission.admit(Ask("r", "t"), placement, Progress(since), None)


async def admitted(
    admission: Admission, route: RouteConfig, request: RouteRequest, since: float
) -> Local:
    plan = await plan_of(admission, route, request, since)
    assert isinstance(plan, Local), plan
    return plan


async def overloaded(
    admission: Admission, route: RouteConfig, request: RouteRequest, since: float
) -> bool:
    """Refused 429 `overloaded`: its SLO passed while it waited."""
    plan = await plan_of(admission, route, request, since)
    return isinstance(plan, Reject) and plan.code is Refusal.OVERLOADED
