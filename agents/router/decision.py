"""What the router hands the gateway: a decision (the ranked workers and why), and for each
dispatch a ticket that the gateway brings back with what it saw."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.router.policies import Candidate


@dataclass
class Decision:
    policy: str
    ranked: list[Candidate]
    reason: str
    vetoed: list[Candidate] = field(default_factory=list)
    unavailable: int = 0  # workers of the model not serving or with an open breaker
    total: int = 0  # workers of the model
    pd: str | None = None  # a disaggregated model: "local" or "disaggregated"
    model: str = ""
    prefill: Candidate | None = None  # the prefill worker, when disaggregated

    @property
    def best_ttft_s(self) -> float | None:
        return self.ranked[0].ttft_s if self.ranked and self.policy == "cost" else None

    def describe(
        self, chosen: str | None, top: int = 3, wait_s: float | None = None
    ) -> dict[str, object]:
        """`wait_s`: the wait for a first byte admission predicted at the best worker."""
        pd = {"pd": self.pd, "prefill_worker": self.prefill.worker.id if self.prefill else None}
        return {
            "policy": self.policy,
            "worker": chosen,
            "reason": self.reason,
            **(pd if self.pd else {}),
            "candidates": [
                {"worker": c.worker.id, "ttft_ms": round(c.ttft_s * 1000, 1),
                 "matched_tokens": c.matched_tokens, "load": c.load,
                 **({"score_ms": round(c.score_s * 1000, 1)} if self.policy == "cost" else {}),
                 **({"decode_ms": round(c.decode_s * 1000, 1)} if c.decode_s else {}),
                 **({"wait_ms": round(wait_s * 1000, 1)} if i == 0 and wait_s is not None
                    else {})}
                for i, c in enumerate(self.ranked[:top])
            ],
            "vetoed": {c.worker.id: c.veto for c in self.vetoed},
        }  # fmt: skip


@dataclass
class Ticket:
    """One dispatch to one worker, for what comes back."""

    worker_id: str
    model: str
    sent_at: float
    prompt_tokens: int
    uncached_tokens: int
    queued_ahead: int  # prefill tokens the worker had queued when this was sent
    first_at: float | None = None
    done: bool = False
    learns_prefill: bool = True  # not prefilled elsewhere, nor held back by the engine
    step_s: float = 0.0  # the decode step a busy worker finishes before it prefills this
    polls: int = 0  # the worker's answered polls when this was sent
    max_new: int | None = None  # the request's max_tokens
    predicted_s: float = 0.0  # its wait for a first byte there, as admission or the cost
    # policy predicted it
    active_at: float = 0.0  # when it was sent, or its answer last moved (the audit's)
    probe: bool = False  # a canary: in flight as any request, but the router learns nothing of it
    service_class: int = 1  # its class (ServiceClass)
    holds: float = 0.0  # KV tokens it will take by its end (uncached prompt, expected answer)
