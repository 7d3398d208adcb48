"""What a settled request's usage record says: served with its tokens and price, a cascade's
two answers both in it, a refusal and a hop at no cost, the operator's and an unknown
caller's not recorded."""

from __future__ import annotations

from pathlib import Path

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.prices import PriceList

from agents.config import ModelConfig, RegionConfig, Tenant
from agents.ledger.journal import Journal
from agents.ledger.record import Ledger
from agents.metrics import Settled

CHEAP, STRONG = "small", "large"
PRICES = {CHEAP: PriceList([(0, 100_000, 50_000, 400_000)], {"batch": 0.5}),
          STRONG: PriceList([(0, 1_000_000, 500_000, 4_000_000)], {})}  # fmt: skip
CONFIG = RegionConfig(
    1, "", "eu-west", "local", "eu",
    models={m: ModelConfig(m, 8192, frozenset(), "", p) for m, p in PRICES.items()},
    tenants={"acme": Tenant("acme", "standard", None, None, None, discount=0.25)},
)  # fmt: skip


def _noted(tmp_path: Path, *settled: Settled, status: int = 200) -> list[pb.UsageRecord]:
    journal = Journal(tmp_path)
    ledger = Ledger(journal, lambda: "eu-west-1", wall=lambda: 1_800_000_000.0)
    for n, s in enumerate(settled):
        ledger.note(f"r{n}", CONFIG, status, s, "ok", 10.0, 12.5)
    journal.flush()
    records = journal.records_after(0, 100)
    journal.close()
    return records


def test_a_served_request_is_priced_at_its_class_and_its_tenants_discount(
    tmp_path: Path,
) -> None:
    (record,) = _noted(tmp_path, Settled(CHEAP, "acme", "w1", completion_tokens=100,
                                         prompt_tokens=1000, cached_tokens=400, waited_s=0.1,
                                         service_class="batch", key="mk-1"))  # fmt: skip
    assert (record.kind, record.api_key, record.node) == ("served", "mk-1", "eu-west-1")
    assert record.started_us == 1_800_000_000_000_000 - 2_500_000
    # 600 at 100 nanos, 400 at 50, 100 at 400: 120,000; batch at half, a quarter off
    assert record.cost_nanos == 45_000


def test_a_cascade_records_both_answers_and_prices_each_at_its_model(tmp_path: Path) -> None:
    (record,) = _noted(tmp_path, Settled(STRONG, "acme", "w2", completion_tokens=10,
                                         prompt_tokens=100, cached_tokens=0, waited_s=0.1,
                                         service_class="standard", asked="tiered",
                                         extra=((CHEAP, 100, 0, 20, "w1"),)))  # fmt: skip
    assert (record.model, record.answered_model) == ("tiered", STRONG)
    assert (record.prompt_tokens, record.completion_tokens) == (200, 30)
    assert [(c.model, c.completion_tokens, c.worker) for c in record.calls] == [
        (STRONG, 10, "w2"), (CHEAP, 20, "w1")]  # fmt: skip
    strong, cheap = 100 * 1000 + 10 * 4000, 100 * 100 + 20 * 400
    assert record.cost_nanos == round((strong + cheap) * 0.75)


def test_refusals_and_hops_cost_nothing_and_no_tenant_no_record(tmp_path: Path) -> None:
    refused, hop, cut = _noted(
        tmp_path,
        Settled(CHEAP, "acme", service_class="standard"),
        Settled(CHEAP, "acme", "peer:us-east", completion_tokens=5, prompt_tokens=50,
                service_class="standard"),
        Settled(CHEAP, "acme", "w1", completion_tokens=7, prompt_tokens=50, waited_s=0.1,
                service_class="standard", estimated=True),
        Settled(CHEAP, "operator", "w1", completion_tokens=5, prompt_tokens=50, waited_s=0.1),
        Settled(CHEAP, "", service_class="standard"),
    )  # fmt: skip
    assert (refused.kind, refused.prompt_tokens, refused.cost_nanos) == ("refused", 0, 0)
    assert (hop.kind, hop.escalated_to, hop.completion_tokens, hop.cost_nanos) == (
        "hop", "us-east", 0, 0)  # fmt: skip
    assert (cut.kind, cut.estimated, cut.completion_tokens) == ("served", True, 7)


def test_a_peers_request_refused_here_is_recorded_here_only_when_the_peer_relays_it(
    tmp_path: Path,
) -> None:
    """A region that escalated a request asks its next peer when one answers 429, 503 or 5xx,
    or records the refusal itself: the refusing peer records nothing (else one request is
    charged twice: us-west's refusal and eu-west's answer). A 400 is relayed to the client as
    the peer's answer, and the peer keeps its record (its origin records a hop)."""
    peer_refusal = Settled(CHEAP, "acme", service_class="standard", came_from="us-east")
    batch_line = Settled(CHEAP, "acme", service_class="batch", came_from="@control-plane")
    assert [r.kind for r in _noted(tmp_path / "a", peer_refusal, batch_line, status=503)] == [
        "refused"
    ]  # fmt: skip (the batch line's: the control plane sends lines to no peer)
    assert [r.kind for r in _noted(tmp_path / "b", peer_refusal, status=429)] == []
    (relayed,) = _noted(tmp_path / "c", peer_refusal, status=400)
    assert (relayed.kind, relayed.came_from) == ("refused", "us-east")


def test_a_stream_carried_on_is_recorded_once_where_its_client_came(tmp_path: Path) -> None:
    began_here, carried_there, began_there = _noted(
        tmp_path,
        # begun on w1, 30 tokens, carried on by us-east: its usage reads as the whole answer's
        Settled(CHEAP, "acme", "peer:us-east", completion_tokens=100, prompt_tokens=1000,
                cached_tokens=0, waited_s=0.1, service_class="standard",
                began=("w1", 30), kept=True),
        # the peer's part of such a stream: its engine's work, its origin's to charge
        Settled(CHEAP, "acme", "w7", completion_tokens=70, prompt_tokens=1030, cached_tokens=0,
                waited_s=0.1, service_class="standard", came_from="us-east", carried=12),
        # begun by us-east (which records the 30 it made), carried on by w2 here
        Settled(CHEAP, "acme", "w2", completion_tokens=100, prompt_tokens=1000, cached_tokens=0,
                waited_s=0.1, service_class="standard", began=("peer:us-east", 30)),
    )  # fmt: skip
    assert (began_here.kind, began_here.worker, began_here.escalated_to) == (
        "served", "w1", "us-east")  # fmt: skip
    assert (began_here.prompt_tokens, began_here.completion_tokens) == (1000, 100)
    assert began_here.cost_nanos == round((1000 * 100 + 100 * 400) * 0.75)
    assert (carried_there.kind, carried_there.worker, carried_there.cost_nanos) == (
        "carried", "w7", 0)  # fmt: skip
    assert (carried_there.prompt_tokens, carried_there.completion_tokens) == (1030, 70)
    assert (began_there.kind, began_there.worker) == ("served", "w2")
    assert (began_there.prompt_tokens, began_there.completion_tokens) == (0, 70)
    assert began_there.cost_nanos == round(70 * 400 * 0.75)


def test_a_tiered_answer_a_peer_made_is_recorded_where_it_may_be_cascaded(tmp_path: Path) -> None:
    (record,) = _noted(tmp_path, Settled(STRONG, "acme", "peer:us-east", completion_tokens=10,
                                         prompt_tokens=100, cached_tokens=0, waited_s=0.1,
                                         service_class="standard", asked="tiered", kept=True,
                                         extra=((CHEAP, 100, 0, 20, "peer:us-east"),)))  # fmt: skip
    assert (record.kind, record.escalated_to, record.worker) == ("served", "us-east", "")
    assert (record.prompt_tokens, record.completion_tokens) == (200, 30)
    assert record.cost_nanos == round((100 * 1000 + 10 * 4000 + 100 * 100 + 20 * 400) * 0.75)


def test_a_tiered_answer_whose_client_left_is_recorded_by_the_peer(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    ledger = Ledger(journal, lambda: "eu-west-1", wall=lambda: 1_800_000_000.0)
    # the region it came to: its client left before the peer's whole answer came back
    ledger.note("r1", CONFIG, 499, Settled(CHEAP, "acme", "peer:us-east", waited_s=0.1,
                                           service_class="standard", kept=True),
                "client_gone", 10.0, 12.5)  # fmt: skip
    # the peer: its client (that region) left; a part it was told was that region's
    ledger.note("r1", CONFIG, 499, Settled(CHEAP, "acme", "w7", completion_tokens=20,
                                           prompt_tokens=100, waited_s=0.1, carried=0,
                                           service_class="standard", came_from="us-east"),
                "client_gone", 10.0, 12.5)  # fmt: skip
    journal.flush()
    hop, served = journal.records_after(0, 100)
    journal.close()
    assert (hop.kind, hop.escalated_to, hop.cost_nanos) == ("hop", "us-east", 0)
    assert (served.kind, served.worker, served.completion_tokens) == ("served", "w7", 20)
    assert served.cost_nanos == round((100 * 100 + 20 * 400) * 0.75)
