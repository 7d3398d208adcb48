"""A request's usage record, made once at its end from what it came to (`Settled`) and put in
the journal: served here (with its tokens), refused before any engine's work (no tokens), or,
where a peer region served it, the hop alone (the peer records what it used). A peer's
request refused here in a way the peer moves on from (429, 503, 5xx) is not recorded here:
the peer asks its next region, or records the refusal itself. A tiered
request whose cheaper tier's answer was asked again of the strongest (a cascade) has both
answers in its tokens, its cost and its `calls`.

A stream cut mid-answer and carried on is one record, kept by the region its client came to,
whoever made its parts: the prompt once and every token its client got as completion. A peer
that carried it on records its part as `carried`, at no cost (its engine's work, for
reconciliation). So is a tiered request whose tier (with a cascade) a peer answered: the
region it came to may cascade the answer, and records both answers in one record; but where
its client left before the peer's whole answer came back, the region it came to records the
hop and the peer the answer, as for any escalated request. Where a
peer began the answer and the stream broke off from it, that peer recorded the part it made
itself (its client, this region, left mid-stream): this region's record then holds only the
completion tokens made after it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from meridian_pb.fleet.v1 import fleet_pb2 as pb
from meridian_pb.fleet.v1.assertion import CONTROL_PLANE

from agents.config import RegionConfig
from agents.ledger.journal import Journal, JournalFull
from agents.metrics import Settled
from agents.router.escalation import tries_another

log = logging.getLogger(__name__)

PEER = "peer:"
CLIENT_GONE = 499  # the status a request whose client left is counted with


def kind_of(settled: Settled) -> str:
    """served, refused, hop or carried (see the module's docstring)."""
    if settled.carried is not None:
        return "carried"
    if settled.worker.startswith(PEER):  # recorded here if the peer's usage came back
        known = settled.prompt_tokens is not None or settled.completion_tokens is not None
        return "served" if settled.kept and known else "hop"
    if settled.waited_s is not None or settled.prompt_tokens or settled.completion_tokens:
        return "served"
    return "refused"


Answer = tuple[str, int, int, int, str]  # model, prompt, cached, completion tokens, worker


def answers_of(settled: Settled) -> list[Answer]:
    """Its answers: the one its client got, and any made for it besides (a cascade's)."""
    got = (settled.model, settled.prompt_tokens or 0, settled.cached_tokens or 0,
           settled.completion_tokens or 0, _engine(settled))  # fmt: skip
    return [got, *settled.extra]


def priced(
    config: RegionConfig, settled: Settled, answers: list[Answer], at_s: float
) -> int | None:
    """What the answers cost its tenant at `at_s` (nanos); None where a model has no price
    then."""
    payer = config.tenants.get(settled.tenant)
    discount = payer.discount if payer is not None else 0.0
    cost: int | None = 0
    for name, p, c, o, _ in answers:
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
    if kind in ("refused", "carried"):  # carried: the region that reserved it settles it
        return 0
    if settled.prompt_tokens is None and settled.completion_tokens is None:
        return None
    return priced(config, settled, answers_of(settled), at_s)


def _billed(settled: Settled) -> list[Answer]:
    """A served record's answers; of a stream a peer began, what was made after it (the
    peer recorded its own part)."""
    answers = answers_of(settled)
    began = settled.began
    if began is not None and began[0].startswith(PEER):
        model, _, _, completion, worker = answers[0]
        answers[0] = (model, 0, 0, max(0, completion - began[1]), worker)
    return answers


def _engine(settled: Settled) -> str:
    """The engine of this region's that its record names: the one that answered, or, for a
    stream a peer carried on, the one here that began it."""
    if not settled.worker.startswith(PEER):
        return settled.worker
    began = settled.began
    return began[0] if began is not None and not began[0].startswith(PEER) else ""


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
        came_from = settled.came_from
        if kind == "refused" and came_from and came_from != CONTROL_PLANE and tries_another(status):
            return  # a peer's request refused here in a way it moves on from: it asks its next
            # peer, or records the refusal itself; one record, where its client came
        if (
            kind == "carried"
            and status == CLIENT_GONE
            and settled.carried == 0
            and (settled.first_at is None)
        ):  # its sender left before this whole answer reached it: it could not record it
            kind = "served"  # (it records a hop)
        ended_us = int(self.wall() * 1e6)
        started_us = ended_us - int((now - started) * 1e6)
        served = kind == "served"
        answers = _billed(settled) if served else answers_of(settled) if kind == "carried" else []
        # a hop, a refusal or a peer's part carried on: 0
        cost = priced(config, settled, answers if served else [], started_us / 1e6)
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
        worker = _engine(settled)  # its calls' (a cascade's) name theirs
        if worker and kind in ("served", "carried"):
            record.worker = worker
        if settled.came_from:
            record.came_from = settled.came_from
        if settled.worker.startswith(PEER):  # a hop, or a stream a peer carried on
            record.escalated_to = settled.worker.removeprefix(PEER)
        if settled.estimated:
            record.estimated = True
        if settled.extra:
            record.calls.extend(
                pb.UsageCall(
                    model=m, prompt_tokens=p, cached_tokens=c, completion_tokens=o, worker=w
                )
                for m, p, c, o, w in answers
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
