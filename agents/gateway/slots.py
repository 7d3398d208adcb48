"""A worker's in-flight slot for one request (the router's ticket), held by `with` around
the call (agents/gateway/calls.py): what ends without the worker's answer frees it, and,
where a higher class may take its room, what it becomes then (agents/router/classes.py)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from meridian_pb.fleet.v1.classes import ServiceClass

from agents.gateway.relay import Answered, Outcome, Refused, Yielded
from agents.gateway.streams import preempted
from agents.held import Held
from agents.router.classes import ABORT_AGAIN_S, TAKES, Victim, victim_for
from agents.router.decision import Ticket

if TYPE_CHECKING:
    from agents.gateway.calls import EngineCalls, PrefillHalf

# a stream of a class that takes lower classes' room with no first token this long past its
# predicted wait: its engine holds it for room a lower class's request has there, which
# gives way (agents/router/classes.py); the engine's own priority never frees its KV pool
RESCUE_S = 0.25


class Slot(Held):
    """A worker's in-flight slot (the router's ticket) for one request; see `dispatch`."""

    __slots__ = ("batch", "calls", "failed", "prefill", "rescue", "rescues", "rid", "sent",
                 "ticket", "url", "victim")  # fmt: skip

    def __init__(self, calls: EngineCalls, ticket: Ticket, url: str, rid: str) -> None:
        super().__init__()
        self.calls, self.ticket, self.url, self.rid = calls, ticket, url, rid
        self.batch = 1  # prompts, for a completions batch
        self.sent = False  # the request may have reached the engine
        self.prefill: PrefillHalf | None = None  # a PD request's prefill half
        self.failed = False  # the go ended without its answer (Retry, Cut, Broken)
        self.victim: Victim | None = None  # a higher class may preempt it until it starts
        self.rescue: asyncio.TimerHandle | None = None  # see `rescue_after`
        self.rescues = 0

    @property
    def preempted(self) -> bool:
        return self.victim is not None and self.victim.preempted

    def rescue_after(self, delay_s: float, served: ServiceClass) -> None:
        """If its first token has not come in `delay_s`, a lower class's request on its
        worker that gives way is taken (up to TAKES, RESCUE_S apart)."""
        loop = asyncio.get_running_loop()
        self.rescue = loop.call_later(delay_s, self._rescued, served)

    def _rescued(self, served: ServiceClass, taken: Victim | None = None) -> None:
        self.rescue = None
        ticket = self.ticket
        if ticket.first_at is not None or ticket.done:
            return
        now = self.calls.router.clock()
        if taken is not None and not taken.gone:
            taken.again(now)
        else:
            running = self.calls.admission.running.get(ticket.model, {}).values()
            taken = victim_for(running, served, ticket.worker_id, False)
            if taken is not None and taken.ticket.worker_id == ticket.worker_id:
                taken.take(now)
                self.rescues += 1
            else:
                taken = None
        if self.rescues < TAKES or (taken is not None and not taken.gone):
            loop = asyncio.get_running_loop()
            self.rescue = loop.call_later(ABORT_AGAIN_S, self._rescued, served, taken)

    def taken(self) -> Outcome:
        """What becomes of it, its room taken by a higher class: it waits again (its class
        requeues), or it is answered 503 (preempted before its engine started it)."""
        victim = self.victim
        assert victim is not None
        if victim.requeued:
            books = self.calls.router.books
            books.classes[self.ticket.model, victim.service_class.label, "requeued"] += 1
            return Yielded(self.ticket.worker_id)
        return Refused(preempted())

    def ended(self, outcome: Outcome) -> Outcome:
        self.failed = not isinstance(outcome, Answered)
        return outcome

    def release(self, error: BaseException | None) -> None:
        if self.rescue is not None:
            self.rescue.cancel()
        if (error is not None or self.failed) and self.prefill is not None:
            self.prefill.task.cancel()  # its own slot frees its worker
        ticket = self.ticket
        if self.victim is not None:
            self.calls.admission.discharge(ticket.model, self.victim)
        if ticket.done:  # finished or failed: the router knows
            return
        self.calls.router.abandoned(ticket)
        self.calls.admission.notify(ticket.model)
        if self.sent:
            self.calls.abort_later(self.url, self.rid, self.batch)
