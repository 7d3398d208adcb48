"""A routing policy's `classes` block and the names of service classes, as the admin API
takes them (the rules themselves: meridian_pb/fleet/v1/classes.py, which the agents enforce)."""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from meridian_pb.fleet.v1.classes import BY_NAME, policy_for
from pydantic import Field, ValidationError, model_validator

from controlplane.schemas.common import Spec


class ServiceClassName(StrEnum):
    """A service class, from highest (served first, shed last)."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    FLEX = "flex"
    BATCH = "batch"


def rank(name: ServiceClassName) -> int:
    """0 for the highest class."""
    return BY_NAME[name.value].value


class ClassRuleSpec(Spec):
    """What is given of one class's rule; a field not given keeps the class's default."""

    weight: float | None = Field(
        default=None, ge=0.001, le=1000, description="its weight in fair queueing between "
        "classes when the model is saturated (defaults: 64, 16, 4, 1 from interactive down)",
    )  # fmt: skip
    reserve: float | None = Field(
        default=None, ge=0, le=0.9, description="share of each worker's KV pool, and of the "
        "requests its engine runs at once, that lower classes may not take while this class "
        "has had a request lately (default: 0.2 for interactive, 0 for the others)",
    )  # fmt: skip
    max_wait_s: float | None = Field(
        default=None, ge=0.1, le=86_400, description="the longest a request waits for "
        "admission before it is refused 429 (defaults: the route's TTFT SLO for interactive "
        "and standard, 120 s for flex, 600 s for batch)",
    )  # fmt: skip
    slack: float | None = Field(
        default=None, ge=0.01, le=1, description="where max_wait_s applies: the share of the "
        "route's TTFT SLO it is admitted against, its wait not counted (defaults: flex 0.5, "
        "batch 0.25): it runs on capacity others leave",
    )  # fmt: skip
    requeue: bool | None = Field(
        default=None, description="where max_wait_s applies: a request of it running on an "
        "engine, its client having seen nothing yet, gives way to a higher class's request "
        "that finds no room (aborted there, admitted again within its max_wait_s; the work "
        "done on it is lost). Defaults: true for flex and batch",
    )  # fmt: skip


class ClassesSpec(Spec):
    """How a model's service classes are admitted in a region."""

    interactive: ClassRuleSpec | None = None
    standard: ClassRuleSpec | None = None
    flex: ClassRuleSpec | None = None
    batch: ClassRuleSpec | None = None
    preempt: bool = Field(
        default=False, description="a request of a higher class that would wait may take the "
        "place of a lower class's request that an engine has not started (aborted there, "
        "answered 503 with Retry-After)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _whole(self) -> Self:
        """The rules with their defaults, as the agents will read them."""
        try:
            policy_for(self.model_dump(exclude_none=True))
        except ValidationError as error:
            raise ValueError("; ".join(e["msg"] for e in error.errors())) from None
        return self
