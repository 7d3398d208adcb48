"""Fair shares between tenants on a saturated model, as admission weighs them (the pure part;
the outcome over real engines: test_isolation.py)."""

from __future__ import annotations

from meridian_pb.fleet.v1.classes import ServiceClass

from agents.config import Tenant
from agents.router.fairness import Fairness


def _tenant(name: str, weight: float = 1.0) -> Tenant:
    return Tenant(name, "standard", None, None, None, weight=weight)


def test_shares_follow_the_places_held_and_the_weights() -> None:
    fair = Fairness()
    acme, bank = _tenant("acme"), _tenant("bank", weight=3.0)
    assert fair.standing("llama", "acme") == 0  # nobody holds anything: nothing to decide
    for _ in range(10):
        fair.take("llama", acme)
    assert fair.standing("llama", "acme") == 0  # alone: as before
    fair.take("llama", bank)
    assert (fair.standing("llama", "acme"), fair.standing("llama", "bank")) == (1, -1)
    # weights: bank's share of 14 places is three quarters; acme's 10 of them is over its 3.5
    for _ in range(3):
        fair.take("llama", bank)
    assert (fair.standing("llama", "acme"), fair.standing("llama", "bank")) == (1, -1)
    assert fair.queue_share("llama", "bank", 128) == 96
    assert fair.queue_share("llama", "acme", 128) == 32
    fair.queued("llama", "bank", 1)
    assert fair.under_waiting("llama")
    fair.queued("llama", "bank", -1)
    assert not fair.under_waiting("llama")
    for _ in range(10):
        fair.give("llama", "acme")
    for _ in range(4):
        fair.give("llama", "bank")
    assert fair.held == {}  # all given back: nothing kept
    assert fair.total_weight == {}


def test_tenants_holding_alike_are_even() -> None:
    fair = Fairness()
    for name in ("a", "b", "c"):
        for _ in range(4):
            fair.take("qwen", _tenant(name))
    assert {fair.standing("qwen", n) for n in ("a", "b", "c")} == {0}
    assert fair.standing("llama", "a") == 0  # another model: its own places


def test_a_request_is_crowded_only_by_another_tenant_well_over_its_share() -> None:
    """What a rollout's checks leave out (issue 40 §3): a wait on another tenant's load, not
    the ups and downs of tenants holding about alike, nor the request's own tenant."""
    fair = Fairness()
    acme, bank = _tenant("acme"), _tenant("bank")
    for _ in range(10):
        fair.take("llama", acme)
    assert not fair.crowded("llama", "bank")  # acme alone: nobody to crowd
    fair.take("llama", bank)
    assert fair.crowded("llama", "bank")  # 10 of 11 places, its share 5.5
    assert not fair.crowded("llama", "acme")  # bank is under its share: it crowds nobody
    for _ in range(6):
        fair.take("llama", bank)
    assert not fair.crowded("llama", "bank")  # 10 against 7: 1.5 over, under a quarter


def test_a_tenant_under_its_share_waiting_with_batch_work_holds_back_no_interactive_request() -> (
    None
):
    """Shares are kept within a class and those above it: a higher class is not held back by
    lower classes' waiting tenants; a lower class still is by a higher one's."""
    fair = Fairness()
    chat, nightly = _tenant("chat"), _tenant("nightly")
    for _ in range(10):
        fair.take("llama", chat)
    fair.take("llama", nightly)
    fair.queued("llama", "nightly", 1, ServiceClass.BATCH)
    assert fair.standing("llama", "chat") == 1  # over its share: but nightly waits in batch
    assert not fair.under_waiting("llama", ServiceClass.INTERACTIVE)
    assert not fair.under_waiting("llama", ServiceClass.FLEX)
    assert fair.under_waiting("llama", ServiceClass.BATCH)
    fair.queued("llama", "nightly", 1, ServiceClass.STANDARD)
    assert fair.under_waiting("llama", ServiceClass.STANDARD)
    assert not fair.under_waiting("llama", ServiceClass.INTERACTIVE)
    fair.queued("llama", "nightly", -1, ServiceClass.STANDARD)
    fair.queued("llama", "nightly", -1, ServiceClass.BATCH)
    assert fair.waiting == {"llama": {}}  # nobody waits: nothing kept
    assert fair.classes == {"llama": {}}
