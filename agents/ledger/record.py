"""A request's usage record, made once at its end from what it came to (`Settled`) and put in
the journal: served here (with its tokens), refused before any engine's work (no tokens), or,
where a peer region served it, the hop alone (the peer records what it used). A tiered
request whose cheaper tier's answer was asked again of the strongest (a cascade) has both
answers in its tokens, its cost and its `calls`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from meridian_pb.fleet.v1 import fleet_pb2 as pb

from agents.config import RegionConfig
from agents.ledger.journal import Journal, JournalFull
from agents.metrics import Settled

log = logging.getLogger(__name__)

PEER = "peer:"


def kind_of(settled: Settled) -> str:
    """served, refused or hop (see the module's docstring)."""
    if settled.worker.startswith(PEER):
        return "hop"
    if settled.waited_s is not None or settled.prompt_tokens or settled.completion_tokens:
        return "served"
    return "refused"


def answers_of(settled: Settled) -> list[tuple[str, int, int, int]]:
    """Its answers' (model, prompt, cached, completion tokens): the one its client got, and
    any made for it besides (a cascade's)."""
    got = (settled.model, settled.prompt_tokens or 0, settled.cached_tokens or 0,
           settled.completion_tokens or 0)  # fmt: skip
    return [got, *settled.extra]


def priced(
    config: RegionConfig, settled: Settled, answers: list[tuple[str, int, int, int]], at_s: float
) -> int | None:
    """What the answers cost its tenant at `at_s` (nanos); None where a model has no price
    then."""
    payer = config.tenants.get(settled.tenant)
    discount = payer.discount if payer is not None else 0.0
    cost: int | None = 0
    for name, p, c, o in answers:
        model = config.models.get(name)
        price = None if model is None or model.prices is None else model.prices.cost_nanos(
            at_s, p, c, o, settled.service_class, discount)  # fmt: skip
        cost = None if cost is None or price is None else cost + price
    return cost


def spent(config: RegionConfig, settled: Settled, at_s: float) -> int | None:
    """What a request cost for its tenant's budgets (nanos): as its record says where it was
    served here; a hop's answer at this region's prices (the peer records it, and this region
    reserved it); a refusal nothing; None where its usage is not known (its reservation is
    spent)."""
    kind = kind_of(settled)
    if kind == "refused":
        return 0
    if settled.prompt_tokens is None and settled.completion_tokens is None:
        return None
    return priced(config, settled, answers_of(settled), at_s)


class Ledger:
    """The gateway's side of the ledger: a record per settled request, into the journal."""

    def __init__(
        self,
        journal: Journal,
        node: Callable[[], str],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.journal, self.node, self.wall = journal, node, wall
        self.dropped = 0  # records the journal could not take (each logged)

    def note(
        self,
        request_id: str,
        config: RegionConfig,
        status: int,
        settled: Settled,
        code: str,
        started: float,
        now: float,
    ) -> None:
        """`started`, `now`: the gateway's monotonic clock. A request of no tenant (refused
        before it was authenticated) or the operator's is not a tenant's to pay for."""
        tenant = settled.tenant
        if not tenant or tenant == "operator":
            return
        kind = kind_of(settled)
        ended_us = int(self.wall() * 1e6)
        started_us = ended_us - int((now - started) * 1e6)
        hop, served = kind == "hop", kind == "served"
        answers = answers_of(settled) if served else []
        cost = priced(config, settled, answers, started_us / 1e6)  # a hop or a refusal: 0
        prompt = sum(a[1] for a in answers)
        cached = sum(a[2] for a in answers)
        completion = sum(a[3] for a in answers)
        record = pb.UsageRecord(
            request_id=settled.asked_as or request_id,  # a peer's: as its client knows it
            kind=kind,
            tenant=tenant,
            api_key=settled.key,
            model=settled.asked or settled.model,
            answered_model=settled.model,
            region=config.region,
            node=self.node(),
            service_class=settled.service_class,
            prompt_tokens=prompt,
            cached_tokens=cached,
            completion_tokens=completion,
            started_us=started_us,
            ended_us=ended_us,
            outcome=code,
            status=status,
            cost_nanos=cost,
        )
        # the rarer fields set only where they are: a field given as empty costs as much
        if served and settled.worker:
            record.worker = settled.worker
        if settled.came_from:
            record.came_from = settled.came_from
        if hop:
            record.escalated_to = settled.worker.removeprefix(PEER)
        if settled.estimated:
            record.estimated = True
        if settled.extra:
            record.calls.extend(
                pb.UsageCall(model=m, prompt_tokens=p, cached_tokens=c, completion_tokens=o)
                for m, p, c, o in answers
            )
        try:
            self.journal.append(record)
        except (JournalFull, ValueError) as error:  # ValueError: the journal is closed
            self.dropped += 1
            log.error("request %s: its usage record was not journaled: %s", request_id, error)

    def meter(self, region: str, worker: str, since_s: float, until_s: float,
              prompt: int, generation: int) -> None:  # fmt: skip
        """An engine's own counters over [since_s, until_s] (wall clock): a `meter` record."""
        record = pb.UsageRecord(
            request_id=f"meter:{worker}", kind="meter", region=region, node=self.node(),
            worker=worker, started_us=int(since_s * 1e6), ended_us=int(until_s * 1e6),
            prompt_tokens=max(0, prompt), completion_tokens=max(0, generation), outcome="meter",
        )  # fmt: skip
        try:
            self.journal.append(record)
        except (JournalFull, ValueError) as error:
            self.dropped += 1
            log.error("the meter of %s was not journaled: %s", worker, error)
