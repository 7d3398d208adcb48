"""Fair shares between tenants on a model: every request of a model holds a place of its
tenant's (from its admission until it ends); a tenant's fair share of the model here is the
places held, in proportion to the weights of the tenants holding any. Admission
(agents/router/admission.py) asks who is over or under its share, and who crowds whom.
Shares are kept between requests of a class and those above it: a tenant under its share
that waits with batch work holds back no one's interactive request (service classes decide
between classes)."""

from __future__ import annotations

from meridian_pb.fleet.v1.classes import CLASSES, ServiceClass

from agents.config import Tenant
from agents.held import Held

CROWDED_BY = 0.25  # another tenant's places over its fair share, of all held: it crowds


class Places(Held):
    """A request's place among its tenant's on a model, held until it ends."""

    __slots__ = ("fair", "model", "tenant")

    def __init__(self, fair: Fairness, model: str, tenant: Tenant) -> None:
        super().__init__()
        self.fair, self.model, self.tenant = fair, model, tenant
        fair.take(model, tenant)

    def release(self, error: BaseException | None) -> None:
        self.fair.give(self.model, self.tenant.name)


class Fairness:
    """Each model's places by tenant, and the tenants' weights; what each tenant's fair
    share is, and who waits."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, int]] = {}  # model: tenant: places
        self.weight: dict[str, dict[str, float]] = {}  # model: tenant: weight, while held
        self.total_weight: dict[str, float] = {}
        self.waiting: dict[str, dict[str, int]] = {}  # model: tenant: requests queued
        # model: tenant: requests queued, by class
        self.classes: dict[str, dict[str, list[int]]] = {}

    def take(self, model: str, tenant: Tenant) -> None:
        held = self.held.setdefault(model, {})
        n = held.get(tenant.name, 0)
        if not n:
            self.weight.setdefault(model, {})[tenant.name] = tenant.weight
            self.total_weight[model] = self.total_weight.get(model, 0.0) + tenant.weight
        held[tenant.name] = n + 1

    def give(self, model: str, tenant: str) -> None:
        held = self.held[model]
        held[tenant] -= 1
        if not held[tenant]:
            del held[tenant]
            weight = self.weight[model].pop(tenant)
            self.total_weight[model] -= weight
            if not held:
                del self.held[model], self.weight[model], self.total_weight[model]

    def standing(self, model: str, tenant: str) -> int:
        """-1 under its fair share, 1 over it, 0 even (alone, or all alike)."""
        held = self.held.get(model)
        if held is None or len(held) < 2:
            return 0
        places = held.get(tenant, 0)
        share = sum(held.values()) * self.weight[model].get(tenant, 1.0) / self.total_weight[model]
        if places < share - 0.5:
            return -1
        return 1 if places > share + 0.5 else 0

    def places(self, model: str) -> int:
        """The model's places held: its requests here, waiting or in flight."""
        return sum(self.held.get(model, {}).values())

    def crowded(self, model: str, tenant: str) -> bool:
        """Another tenant holds well over its fair share of the model: by `CROWDED_BY` of
        the places held and at least two, not by the ups and downs of tenants alike."""
        held = self.held.get(model)
        if held is None or len(held) < 2:
            return False
        total, weights = sum(held.values()), self.weight[model]
        excess = max(n - total * weights[t] / self.total_weight[model]
                     for t, n in held.items() if t != tenant)  # fmt: skip
        return excess >= max(2.0, CROWDED_BY * total)

    def queue_share(self, model: str, tenant: str, max_queue: int) -> float:
        weights = self.weight.get(model, {})
        total = self.total_weight.get(model, 0.0)
        return max(1.0, max_queue * weights.get(tenant, 1.0) / total) if total else max_queue

    def under_waiting(self, model: str, served: ServiceClass = ServiceClass.BATCH) -> bool:
        """A tenant under its share waits for the model, at class `served` or above."""
        return any(sum(n[: served + 1]) and self.standing(model, t) < 0
                   for t, n in self.classes.get(model, {}).items())  # fmt: skip

    def queued(
        self, model: str, tenant: str, by: int, served: ServiceClass = ServiceClass.STANDARD
    ) -> None:
        waiting = self.waiting.setdefault(model, {})
        waiting[tenant] = waiting.get(tenant, 0) + by
        by_class = self.classes.setdefault(model, {}).setdefault(tenant, [0] * len(CLASSES))
        by_class[served] += by
        if not waiting[tenant]:
            del waiting[tenant], self.classes[model][tenant]
