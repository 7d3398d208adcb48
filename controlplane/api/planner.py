"""The capacity planner: what it last decided and why, and an operator's pause and resume."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from fastapi import APIRouter

from controlplane.api.deps import CurrentPrincipal, ServicesDep, allowed
from controlplane.domain import Role
from controlplane.services.planner import control
from controlplane.services.planner.loop import PlannerConfig

router = APIRouter()


class Action(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"


@router.get(
    "/v1/planner",
    tags=["planner"],
    summary="The capacity planner: its mode, whether it is paused, its guard rails, and what "
    "it last decided for each deployment with autoscale (engines now and planned, the "
    "forecast, the reason, whether the change was made)",
    **allowed(Role.VIEWER),
)
async def status(services: ServicesDep) -> dict[str, Any]:
    return await control.view(services.db, PlannerConfig.of(services.settings))


@router.post(
    "/v1/planner/{action}",
    tags=["planner"],
    summary="Pause the planner (it goes on planning and auditing, and changes nothing) or "
    "resume it",
    **allowed(Role.OPERATOR),
)
async def act(action: Action, services: ServicesDep, who: CurrentPrincipal) -> dict[str, Any]:
    await control.pause(services.db, who.name, action is Action.PAUSE)
    return await control.view(services.db, PlannerConfig.of(services.settings))
