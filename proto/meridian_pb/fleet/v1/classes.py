"""Service classes: who is served first, who is shed first, who may spend another region's
capacity. Both planes use this: the control plane validates tenants, routing policies and
fallback rules with it, and the agents enforce it.

Four classes, from highest: `interactive`, `standard`, `flex`, `batch`. A tenant has a
default class and a ceiling; a request names its class with OpenAI's `service_tier` or the
`x-meridian-class` header, and is clamped to its tenant's ceiling, so it can only lower
itself.

OpenAI's `service_tier` maps so:

| service_tier | class |
|---|---|
| absent, `auto` | the tenant's default class |
| `priority` | interactive |
| `default` | standard |
| `flex` | flex |

(`batch` is named by the header, or is what the Batch API runs its lines as.) The answer
names the class that served it in `x-meridian-class`, and the tier OpenAI would in
`x-meridian-service-tier` (`priority`, `default`, `flex`, or `batch`).
"""

from __future__ import annotations

from enum import IntEnum
from functools import cached_property
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ServiceClass(IntEnum):
    """A class; a lower value is a higher class (served first, shed last)."""

    INTERACTIVE = 0
    STANDARD = 1
    FLEX = 2
    BATCH = 3

    @property
    def label(self) -> str:
        return LABELS[self]

    @classmethod
    def named(cls, name: str) -> ServiceClass:
        """Raises ValueError for a name that is not a class."""
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"{name!r} is not a service class ({', '.join(NAMES)})") from None


CLASSES = tuple(ServiceClass)
LABELS = {c: c.name.lower() for c in CLASSES}
NAMES = tuple(LABELS.values())
BY_NAME = {c.label: c for c in CLASSES}
HEADER = "x-meridian-class"  # a request's class, asked; an answer's, served
TIER_HEADER = "x-meridian-service-tier"  # the answer's class as OpenAI's service_tier
# OpenAI's service_tier: the class it asks (None: the tenant's default)
SERVICE_TIERS: dict[str, ServiceClass | None] = {
    "auto": None,
    "default": ServiceClass.STANDARD,
    "flex": ServiceClass.FLEX,
    "priority": ServiceClass.INTERACTIVE,
}
TIER_OF = {
    ServiceClass.INTERACTIVE: "priority",
    ServiceClass.STANDARD: "default",
    ServiceClass.FLEX: "flex",
    ServiceClass.BATCH: "batch",
}
DEFAULT_ESCALATE = (ServiceClass.INTERACTIVE, ServiceClass.STANDARD)  # a fallback rule's


def clamp(asked: ServiceClass | None, default: ServiceClass, ceiling: ServiceClass) -> ServiceClass:
    """The class a request is served at: what it asked (or its tenant's default), never above
    its tenant's ceiling."""
    wanted = default if asked is None else asked
    return wanted if wanted >= ceiling else ceiling


Share = Annotated[float, Field(ge=0.0, le=0.9)]


class ClassRule(BaseModel):
    """How one class is admitted on a model in a region."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(
        ge=0.001, le=1000, description="its weight in fair queueing between classes when the "
        "model is saturated: of the places freed, classes that wait get them in proportion",
    )  # fmt: skip
    reserve: Share = Field(
        default=0.0, description="share of each worker's KV pool, and of the requests its "
        "engine runs at once, that lower classes may not take, while this class has had a "
        "request lately",
    )  # fmt: skip
    max_wait_s: float | None = Field(
        default=None, ge=0.1, le=86_400, description="the longest a request of it waits for "
        "admission before it is refused 429. null: the route's TTFT SLO (its wait counts "
        "against the SLO, as before classes)",
    )  # fmt: skip
    slack: float = Field(
        default=1.0, ge=0.01, le=1, description="share of the route's TTFT SLO it is admitted "
        "against, its wait not counted: below 1, it runs only where an engine would start it "
        "that soon (capacity others leave). Used where max_wait_s is set",
    )  # fmt: skip
    requeue: bool = Field(
        default=False, description="a request of it that runs on an engine, its client having "
        "seen nothing yet (not streamed, or a stream before its first token), gives way to a "
        "higher class's request that finds no room: it is aborted there and waits for "
        "admission again, within its max_wait_s (a plain whole answer is carried on from what "
        "its engine made; any other starts over). Used where "
        "max_wait_s is set",
    )  # fmt: skip


def _rule(weight: float, **rest: Any) -> ClassRule:
    return ClassRule(weight=weight, **rest)


class ClassPolicy(BaseModel):
    """A route's classes: each one's rule, and whether a higher class may preempt a lower
    one's request that has not sent its first byte."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    interactive: ClassRule = Field(default_factory=lambda: _rule(64, reserve=0.2))
    standard: ClassRule = Field(default_factory=lambda: _rule(16))
    flex: ClassRule = Field(
        default_factory=lambda: _rule(4, max_wait_s=120.0, slack=0.5, requeue=True)
    )
    batch: ClassRule = Field(
        default_factory=lambda: _rule(1, max_wait_s=600.0, slack=0.25, requeue=True)
    )
    preempt: bool = Field(
        default=False, description="a request of a higher class that would wait may take the "
        "place of a lower class's request sent to an engine that has not started it (aborted "
        "there, answered 503 with Retry-After)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _reserves(self) -> ClassPolicy:
        if sum(self.rule(c).reserve for c in CLASSES) > 0.9:
            raise ValueError("the classes' reserves sum past 0.9: the lowest would get nothing")
        return self

    def rule(self, service_class: ServiceClass) -> ClassRule:
        rule: ClassRule = getattr(self, service_class.label)
        return rule

    def requeues(self, service_class: ServiceClass) -> bool:
        """A request of the class gives way to higher classes' (aborted and requeued)."""
        return self._requeues[service_class]

    def takes_room(self, service_class: ServiceClass) -> bool:
        """A request of the class may take a lower class's room: preemption is on, or a
        class below it requeues."""
        return self._takes[service_class]

    @cached_property
    def _requeues(self) -> dict[ServiceClass, bool]:
        return {c: self.rule(c).requeue and self.rule(c).max_wait_s is not None for c in CLASSES}

    @cached_property
    def _takes(self) -> dict[ServiceClass, bool]:
        return {
            c: c < ServiceClass.BATCH
            and (self.preempt or any(self._requeues[b] for b in CLASSES[c + 1 :]))
            for c in CLASSES
        }

    def reserved_above(self, service_class: ServiceClass) -> tuple[tuple[ServiceClass, float], ...]:
        """The reserves of the classes above this one (those it may not take)."""
        return self._above[service_class]

    @cached_property
    def _above(self) -> dict[ServiceClass, tuple[tuple[ServiceClass, float], ...]]:
        """Each class's `reserved_above`, worked out once (a request asks on its path)."""
        return {
            c: tuple((a, self.rule(a).reserve) for a in CLASSES[:c] if self.rule(a).reserve > 0)
            for c in CLASSES
        }


DEFAULT_POLICY = ClassPolicy()


def policy_for(raw: dict[str, Any] | None) -> ClassPolicy:
    """A route's classes from what its routing policy gives: each class's rule is its
    default with the fields given put over it. Raises pydantic's ValidationError for a bad
    one; None or {}: the defaults."""
    if not raw:
        return DEFAULT_POLICY
    merged: dict[str, Any] = {}
    for key, value in raw.items():
        if key in BY_NAME and isinstance(value, dict):
            base = DEFAULT_POLICY.rule(BY_NAME[key]).model_dump()
            merged[key] = {**base, **value}
        else:
            merged[key] = value
    return ClassPolicy.model_validate(merged)
