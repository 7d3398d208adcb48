"""Rollouts: what is declared and what is in force, and an operator's hand on the newest one."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.domain import Role
from controlplane.services.rollouts.control import Operator, view
from controlplane.services.rollouts.driver import RolloutDriver

router = APIRouter()


class Action(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    PROMOTE = "promote"
    ABORT = "abort"


@router.get(
    "/v1/rollouts",
    tags=["rollouts"],
    summary="The declared revision and the one in force, the newest rollout (waves, what each "
    "target holds, each check with its figure and verdict, why it rolled back) and those before",
    **allowed(Role.VIEWER),
)
async def rollouts(
    services: ServicesDep, recent: Annotated[int, Query(ge=1, le=100)] = 10
) -> dict[str, Any]:
    return await view(services.db, recent=recent)


@router.post(
    "/v1/rollouts/current/{action}",
    tags=["rollouts"],
    summary="Pause the newest rollout, resume it (its wave's watch begins again), promote it "
    "to its next wave now (or, with everywhere, to every target), or abort it (roll back)",
    **allowed(Role.OPERATOR),
)
async def act(
    request: Request,
    action: Action,
    services: ServicesDep,
    who: CurrentPrincipal,
    everywhere: Annotated[bool, Query(description="promote: every target at once")] = False,
) -> dict[str, Any]:
    driver = RolloutDriver(services.db, services.feed, observe=request.app.state.metrics.rollout)
    await Operator(driver).act(str(action), who.name, everywhere=everywhere)
    return await view(services.db)
