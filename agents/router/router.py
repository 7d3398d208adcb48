"""The region's router: candidates from the worker table, ranked by the model's policy, with
the router's own load, breaker and learned-speed state; every decision records why.

No I/O and no HTTP library here: the gateway tells the router what it dispatched and what it
saw (first byte, end, failure), and the router learns from it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from meridian_pb.fleet.v1.params import CostParams

from agents.books import Books
from agents.config import RegionConfig, RouteConfig
from agents.engines.tokenizers import PromptTokenizer
from agents.router import predict, ranking
from agents.router.admission import Admission
from agents.router.classes import Holding
from agents.router.decision import Decision, Ticket
from agents.router.escalation import Escalations
from agents.router.plan import (
    Ask,
    Placement,
    Plan,
    Progress,
    Reject,
    Tiering,
    before_placing,
    over,
    refused,
)
from agents.router.policies import POLICIES, Candidate, Policy, RouteRequest, places
from agents.router.view import WorkerView
from agents.workers.prefix import PrefixIndex, salt_root
from agents.workers.table import WorkerTable

log = logging.getLogger(__name__)
TOKEN_BYTES = 4  # a token id in a key


@dataclass
class Exact:
    """A model whose engines publish KV-cache events: their tokenizer, and the index the
    events keep, one block a page."""

    tokenizer: PromptTokenizer
    index: PrefixIndex
    page_size: int


DEFAULT_TOKENS_PER_BYTE = 0.25
DECISIONS_KEPT = 256  # the latest decisions, for /agent/decisions


class Router:
    def __init__(
        self,
        table: WorkerTable,
        clock: Callable[[], float] = time.monotonic,
        books: Books | None = None,
    ) -> None:
        self.table = table
        self.clock = clock
        self.books = books if books is not None else Books()
        self.views: dict[str, WorkerView] = {}
        self._policies: dict[tuple[str, str, str], Policy] = {}
        self._by_model: dict[str, Policy] = {}
        self._bytes: dict[str, tuple[float, float]] = {}  # model -> (prompt bytes, tokens)
        self._pd_models: set[str] = set()  # models with prefill workers
        self.exact: dict[str, Exact] = {}  # model -> its event-kept index
        self._holding: dict[str, Holding] = {}  # model -> what its requests hold, by class
        # (when, request id, decision, the wait admission predicted at its best worker)
        self._recent: deque[tuple[float, str, Decision, float | None]] = deque(
            maxlen=DECISIONS_KEPT
        )
        self.live: dict[str, dict[int, Ticket]] = {}  # worker: its tickets not yet ended
        # (agents/router/audit.py checks them against the engines)
        self.config: RegionConfig | None = None
        self.admission = Admission(self, clock)
        self.escalations = Escalations(clock, self.books)
        # what loading an adapter where it is not held takes, as the adapter keeper measures
        self.cold_load_s: Callable[[], float] = lambda: 1.0

    async def plan(
        self,
        ask: Ask,
        placement: Placement,
        progress: Progress,
        tiering: Tiering | None = None,
    ) -> Plan:
        """Where the request goes next (agents/router/plan.py), the only place that decides:
        what stops it or sends it away before a worker is looked for; a move to another tier
        under load; else admission here, where it waits, bounded, for a worker that can take
        it within the SLO (agents/router/admission.py)."""
        chain = placement.chain
        failing = chain is not None and self.escalations.failing(chain, placement.model)
        first = before_placing(ask, placement, progress, failing)
        if first is not None:
            return first
        if tiering is not None and not progress.attempts:
            moved = await self.admission.by_tier(ask, progress, tiering)
            if moved is not None:
                return moved
        limits = over(ask, placement, progress)
        plan = await self.admission.admit(ask, placement, progress, limits)
        if isinstance(plan, Reject):
            return refused(ask, placement, progress, plan)
        return plan

    def configure(self, config: RegionConfig) -> None:
        """A new snapshot: keep the policies and views of what did not change."""
        policies, by_model = {}, {}
        for route in config.routes.values():
            policy = self._policies.get(route.key) or POLICIES[route.policy](route.params)
            policies[route.key] = by_model[route.model] = policy
        self._policies, self._by_model = policies, by_model
        views = {}
        for worker in config.workers:
            own = config.routes.get(worker.model)
            params = own.params if own is not None else CostParams()
            views[worker.id] = self.views.get(worker.id) or WorkerView(
                worker.id,
                getattr(params, "prefill_tokens_per_s", CostParams().prefill_tokens_per_s),
                getattr(params, "decode_step_s", CostParams().decode_step_s),
            )
        self.views = views
        self._pd_models = {w.model for w in config.workers if w.role == "prefill"}
        for policy in policies.values():
            policy.index.forget_others(set(views))
        events_on = {m for m, r in config.routes.items() if r.params.kv_events}
        self.exact = {m: e for m, e in self.exact.items() if m in events_on}
        for exact in self.exact.values():
            exact.index.forget_others(set(views))
        self.config = config

    def event_index(self, model: str) -> tuple[PrefixIndex, int] | None:
        """The model's index kept by KV-cache events, and its page size, once it has one."""
        exact = self.exact.get(model)
        return (exact.index, exact.page_size) if exact is not None else None

    def use_events(
        self, model: str, tokenizer: PromptTokenizer, page_size: int, capacity_blocks: int
    ) -> PrefixIndex:
        """The model's engines publish KV-cache events: match its prompts as token pages."""
        exact = self.exact.get(model)
        if exact is None or exact.page_size != page_size:
            index = PrefixIndex(TOKEN_BYTES * page_size, capacity_blocks)
            exact = self.exact[model] = Exact(tokenizer, index, page_size)
        return exact.index

    def record(self, request_id: str, decision: Decision, wait_s: float | None = None) -> None:
        """Keep the decision acted on (only a reference: it is described when asked for)."""
        self._recent.append((time.time(), request_id, decision, wait_s))

    def recent_decisions(self, limit: int) -> list[dict[str, object]]:
        newest = list(self._recent)[-limit:][::-1]
        return [
            {"at": round(at, 3), "request_id": rid, "model": d.model,
             **d.describe(d.ranked[0].worker.id if d.ranked else None, wait_s=wait)}
            for at, rid, d, wait in newest
        ]  # fmt: skip

    def status(self) -> dict[str, object]:
        """What the router has learned of each worker, what its engine said of its load at
        the last poll, and its PD choices."""
        return {
            "pd_choices": dict(self.books.pd_choices),
            "workers": {
                v.worker_id: {
                    "inflight": v.inflight,
                    "breaker": v.breaker.state.value,
                    "prefill_tokens_per_s": round(v.prefill_tokens_per_s),
                    "decode_step_ms": round(v.decode_step_s * 1000, 2),
                    "learned": v.learned,
                    "engine": self._polled(v.worker_id),
                }
                for v in self.views.values()
            },
        }

    def _polled(self, worker_id: str) -> dict[str, object] | None:
        entry = self.table.get(worker_id)
        if entry is None or not entry.polls:
            return None
        load = entry.load
        return {"running": load.running, "waiting": load.waiting,
                "pending_tokens": load.pending_tokens, "kv_used_tokens": load.used_tokens,
                "kv_capacity": load.max_total_tokens, "polls": entry.polls}  # fmt: skip

    def tokens_per_byte(self, model: str) -> float:
        seen = self._bytes.get(model)
        if seen is None or seen[0] < 4096:
            return DEFAULT_TOKENS_PER_BYTE
        return seen[1] / seen[0]

    def request(
        self,
        model: str,
        key: bytes,
        tokens: Callable[[PromptTokenizer], bytes] | None = None,
        max_new: int | None = None,
        salt: str | None = None,
        whole: bool = False,
        service_class: int = 1,
    ) -> RouteRequest:
        """`key` is the prompt as bytes; `tokens` gives it as the engine's token ids, for a
        model whose engines publish KV-cache events; `max_new`, the answer's most tokens;
        `salt`, its cache namespace (the engine's `cache_salt`); `whole`, its answer is not
        streamed; `service_class`, its class (ServiceClass)."""
        root = salt_root(salt)
        exact = self.exact.get(model)
        if exact is not None and tokens is not None:
            try:
                ids = tokens(exact.tokenizer)
            except Exception as error:  # a template that fails this prompt: match it roughly
                log.warning("tokenizing a %s prompt failed: %s", model, error)
            else:
                count = max(1, len(ids) // TOKEN_BYTES)
                return RouteRequest(model, ids, count, 1 / TOKEN_BYTES, exact=exact.index,
                                    max_new=max_new, root=root, whole=whole,
                                    service_class=service_class)  # fmt: skip
        ratio = self.tokens_per_byte(model)
        return RouteRequest(model, key, max(1, int(len(key) * ratio)), ratio, max_new=max_new,
                            root=root, whole=whole, service_class=service_class)  # fmt: skip

    def route(self, route: RouteConfig, request: RouteRequest, exclude: set[str]) -> Decision:
        """The model's workers that may take the request, ranked by its policy
        (agents/router/ranking.py), with a PD pair where the model has prefill workers."""
        now = request.now = self.clock()
        request.itl_limit_s = route.slo_itl_s
        policy, views = self._by_model[route.model], self.views
        decision = ranking.rank(policy, self.table, views, route, request, exclude, now)
        if route.model in self._pd_models and decision.ranked:
            ranking.pair(policy, self.table, views, route, request, exclude, now, decision)
        return decision

    def dispatched(
        self,
        chosen: Candidate,
        request: RouteRequest,
        prefilled_elsewhere: bool = False,
        wait_s: float | None = None,
        probe: bool = False,
    ) -> Ticket:
        """`prefilled_elsewhere`: a PD decode worker, whose KV cache comes from the prefill
        worker; it holds the prompt afterwards but does not compute it. `wait_s`: its wait for
        a first byte as admission predicted it (else the policy's stands)."""
        view = chosen.view
        policy = self._by_model.get(request.model)
        if policy is not None and not probe:
            policy.dispatched(chosen.worker.id, request)
        uncached = 0 if prefilled_elsewhere else request.prompt_tokens - chosen.matched_tokens
        uncached = max(0, uncached)
        load = chosen.entry.load
        ahead = round(predict.queued_work(view, load.pending_tokens))
        busy = chosen.busy  # before this request counts
        placed = not prefilled_elsewhere and places(chosen, request)
        ticket = Ticket(
            chosen.worker.id, request.model, self.clock(), request.prompt_tokens, uncached, ahead,
            learns_prefill=not prefilled_elsewhere and load.waiting == 0 and not probe,
            step_s=view.decode_step_s if busy else 0.0, polls=chosen.entry.polls,
            max_new=request.max_new,
            predicted_s=chosen.ttft_s if wait_s is None else wait_s, probe=probe,
        )  # fmt: skip
        ticket.active_at = ticket.sent_at
        answer = view.answer(request.max_new)
        if not probe:
            # the room it takes: its uncached prompt (a cached prefix is shared) and its answer
            ticket.service_class, ticket.holds = request.service_class, uncached + answer
            self.holding(request.model).add(ticket.service_class, ticket.holds, ticket.sent_at)
        view.sent(id(ticket), ticket.sent_at, uncached, answer, placed, probe, request.whole)
        self.live.setdefault(ticket.worker_id, {})[id(ticket)] = ticket
        return ticket

    def probe(self, worker_id: str, text: bytes) -> Ticket | None:
        """A canary of `text` sent to the worker (agents/quality/prober.py): in flight as any
        request, so that admission and the audit count it; it teaches the router nothing.
        None when the worker is not in the table."""
        entry, view = self.table.get(worker_id), self.views.get(worker_id)
        if entry is None or view is None:
            return None
        model = entry.spec.model
        request = RouteRequest(model, text, max(1, int(len(text) * self.tokens_per_byte(model))),
                               self.tokens_per_byte(model), max_new=1)  # fmt: skip
        ticket = self.dispatched(Candidate(entry.spec, entry, view), request, probe=True)
        return ticket

    def holding(self, model: str) -> Holding:
        """What the model's requests in flight from here hold, by class (classes.py)."""
        found = self._holding.get(model)
        if found is None:
            found = self._holding[model] = Holding()
        return found

    def _end(self, ticket: Ticket) -> None:
        ticket.done = True
        if ticket.holds:
            self.holding(ticket.model).remove(ticket.service_class, ticket.holds)
        live = self.live.get(ticket.worker_id)
        if live is not None:
            live.pop(id(ticket), None)

    def _unpolled(self, ticket: Ticket) -> bool:
        """No load poll has landed since the ticket was sent: its work still counts as sent
        since the last poll, so what the gateway now knows of it must be taken off there."""
        entry = self.table.get(ticket.worker_id)
        return entry is not None and entry.polls == ticket.polls

    def first_byte(self, ticket: Ticket, timed: bool = True) -> None:
        """Its first byte came. `timed`: it times the wait for it (not so the end of an answer
        that came whole, with no byte before it: that times the whole answer)."""
        if ticket.first_at is not None:
            return
        ticket.first_at = ticket.active_at = self.clock()
        view = self.views.get(ticket.worker_id)
        if view is None:
            return
        view.first_byte(id(ticket), ticket.first_at, ticket.uncached_tokens, self._unpolled(ticket))
        if ticket.probe or not timed:  # a canary (it asks for log-probabilities): no speed
            return
        view.learn_bias(ticket.predicted_s, ticket.first_at - ticket.sent_at)
        if ticket.learns_prefill and ticket.queued_ahead == 0:
            # only a request with nothing known ahead of it times the prefill alone (less the
            # decode step it waited for): under load a TTFT is mostly queueing, which the cost
            # policy counts on its own
            view.learn_prefill(
                ticket.uncached_tokens, ticket.first_at - ticket.sent_at - ticket.step_s
            )

    def progressed(self, ticket: Ticket, events: int) -> None:
        """Events of its stream relayed to the client."""
        if not ticket.done:
            ticket.active_at = self.clock()
            view = self.views.get(ticket.worker_id)
            if view is not None:
                view.progressed(id(ticket), events)

    def finished(
        self, ticket: Ticket, prompt_bytes: int, prompt_tokens: int | None, completion: int | None
    ) -> None:
        """The answer is complete; usage, where the engine reported it, teaches the router."""
        if ticket.done:
            return
        first_at = ticket.first_at  # None: it came whole, and no first byte timed it
        self.first_byte(ticket, timed=False)
        self._end(ticket)
        now = self.clock()
        view = self.views.get(ticket.worker_id)
        if view is not None:
            flight = view.finished(id(ticket), self._unpolled(ticket))
            if completion:
                view.learn_output(completion, ticket.max_new)
                if flight is not None:
                    view.learn_events(completion, flight.events)
            if completion and completion > 1 and first_at is not None:
                entry = self.table.get(ticket.worker_id)
                batch = entry.load.running if entry is not None else 0
                view.learn_decode((now - first_at) / (completion - 1), batch)
        if prompt_tokens and prompt_bytes:
            seen_bytes, seen_tokens = self._bytes.get(ticket.model, (0.0, 0.0))
            if seen_bytes > 1e8:  # keep it moving: halve the history
                seen_bytes, seen_tokens = seen_bytes / 2, seen_tokens / 2
            self._bytes[ticket.model] = (seen_bytes + prompt_bytes, seen_tokens + prompt_tokens)

    def failed(self, ticket: Ticket) -> None:
        """The worker failed this request (refused, reset, 5xx) before or while answering."""
        if ticket.done:
            return
        self._end(ticket)
        view = self.views.get(ticket.worker_id)
        if view is not None:
            view.failed(id(ticket), _unstarted(ticket), self._unpolled(ticket), self.clock())

    def abandoned(self, ticket: Ticket) -> None:
        """The client went away (or the audit ended it): not the worker's fault."""
        if ticket.done:
            return
        self._end(ticket)
        view = self.views.get(ticket.worker_id)
        if view is not None:
            view.abandoned(id(ticket), _unstarted(ticket), self._unpolled(ticket), ticket.probe)


def _unstarted(ticket: Ticket) -> int:
    """Its uncached prompt tokens, still queued work if its first byte has not come."""
    return ticket.uncached_tokens if ticket.first_at is None else 0
