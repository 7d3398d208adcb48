"""Every count the agent keeps, in one set of books: the daemon owns it and hands it to each
part that counts (the gateway and its parts, the router, escalation, tiers, the quality
guard); `/agent/status`, `/metrics` and the heartbeat's telemetry read it (agents/report.py).

Counts only go up, from the agent's start; a part keeps its own state (a breaker, a queue,
a lease), never a count of what it did.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(eq=False)
class Books:
    # the gateway's answers
    answered: Counter[tuple[str, str]] = field(default_factory=Counter)  # (model, code or "ok")
    # of those, the answers to requests a peer region escalated here
    received: Counter[tuple[str, str]] = field(default_factory=Counter)
    rejections: Counter[tuple[str, str]] = field(default_factory=Counter)  # 429/503: model, code
    faults: Counter[str] = field(default_factory=Counter)  # failed by a fault of ours, by model
    # (model, tenant, code): answers per tenant, so that a rollout's checks can leave out the
    # tenant that gave the most refusals or errors; and (model, load band, what) by load
    by_tenant: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    by_load: Counter[tuple[str, int, str]] = field(default_factory=Counter)
    # the router's
    decisions: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # model, policy,
    # choice ("unified", "local", "disaggregated")
    pd_choices: Counter[str] = field(default_factory=Counter)  # "local" / "disaggregated", sent
    repairs: Counter[str] = field(default_factory=Counter)  # worker: tickets the audit ended
    # escalation: (in|out, peer, reason); answers a peer gave, by model
    escalations: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    escalated: Counter[str] = field(default_factory=Counter)
    # streams carried on: (model, where it went on: "region", "peer" or "ended", why it broke)
    migrations: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # tiered routes: (route, model, why) answered; (route, from, to, why) moved; (route,
    # signal) cascaded; (route) the external classifier late or failed
    tier_answered: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    tier_moves: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    cascades: Counter[tuple[str, str]] = field(default_factory=Counter)
    external_late: Counter[str] = field(default_factory=Counter)
    # service classes: (model, class, outcome): admitted, shed, preempted, escalated; and
    # requeued (times one gave way), past_slo (admitted streams whose first token was late)
    classes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # the quality guard: (model, worker, kind, check)
    quality: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
