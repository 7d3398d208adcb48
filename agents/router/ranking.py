"""The model's workers that may take a request, ranked by its policy: those not serving or
with an open breaker left out and counted, those at the route's in-flight limit vetoed; and
for a model with prefill workers, the PD choice (prefill here or on a prefill worker). The
router (agents/router/router.py) holds the state; this reads it (a worker's view takes its
engine's latest poll, through the view's own method). A request for a LoRA adapter goes first
to workers that hold it, then to those with room to load it, whatever the policy: a load
where it is not held unloads another adapter there sooner or later, which a later request
waits for (measured: `meridian bench adapters`, bench/README.md). The cost policy counts the
load's time in its predicted TTFT, which admission reads."""

from __future__ import annotations

from collections.abc import Mapping

from agents.config import RouteConfig
from agents.router.decision import Decision
from agents.router.policies import Candidate, Policy, RouteRequest
from agents.router.view import WorkerView
from agents.workers.table import WorkerTable

SERVING_ROLES = ("unified", "decode")


def rank(
    policy: Policy,
    table: WorkerTable,
    views: Mapping[str, WorkerView],
    route: RouteConfig,
    request: RouteRequest,
    exclude: set[str],
    now: float,
    roles: tuple[str, ...] = SERVING_ROLES,
) -> Decision:
    candidates, total, unavailable = [], 0, 0
    for entry in table.entries.values():
        worker = entry.spec
        if worker.model != route.model or worker.role not in roles:
            continue
        total += 1
        view = views.get(worker.id)
        if view is None or worker.id in exclude:
            continue
        view.polled(entry.polls, entry.load)
        if not entry.serving or not view.breaker.allows(now):
            unavailable += 1
            continue
        if route.max_inflight is not None and view.inflight >= route.max_inflight:
            candidates.append(Candidate(worker, entry, view, veto="max in flight"))
            continue
        candidates.append(Candidate(worker, entry, view))
    full = [c for c in candidates if c.veto]
    open_ = [c for c in candidates if not c.veto]
    if not open_:
        return Decision(
            policy.name, [], "no worker can take it", full, unavailable, total, model=route.model
        )
    if request.adapter is not None:
        for c in open_:
            c.cold_s = 0.0 if request.adapter in c.entry.adapters else request.cold_load_s
    ranked = policy.rank(open_, request)
    if request.adapter is not None:  # stable: the policy's order within each
        ranked.ranked.sort(key=lambda c: residency(c, request.adapter))
    return Decision(
        policy.name, ranked.ranked, ranked.reason, full + ranked.vetoed, unavailable, total,
        model=route.model,
    )  # fmt: skip


def residency(candidate: Candidate, adapter: str | None) -> int:
    """0: it holds the adapter; 1: it has room to load it; 2: loading it unloads another."""
    entry = candidate.entry
    return 0 if adapter in entry.adapters else 1 if entry.room() else 2


def pair(
    policy: Policy,
    table: WorkerTable,
    views: Mapping[str, WorkerView],
    route: RouteConfig,
    request: RouteRequest,
    exclude: set[str],
    now: float,
    decision: Decision,
) -> None:
    """PD: prefill on the chosen decode worker when little of the prompt is uncached there,
    else on the best prefill worker (and locally anyway if none can take it)."""
    params = route.params
    decode = decision.ranked[0]
    uncached = max(0, request.prompt_tokens - decode.matched_tokens)
    short = uncached <= params.pd_local_max_tokens
    if short or uncached <= params.pd_local_max_ratio * request.prompt_tokens:
        decision.pd = "local"
        decision.reason += f"; prefill here: {uncached} tokens uncached"
        return
    prefill = rank(policy, table, views, route, request, exclude, now, ("prefill",))
    if not prefill.ranked:
        decision.pd = "local"
        decision.reason += f"; prefill here: no prefill worker ({prefill.reason})"
        return
    decision.pd, decision.prefill = "disaggregated", prefill.ranked[0]
    decision.reason += f"; prefill on {prefill.ranked[0].worker.id}: {prefill.reason}"
