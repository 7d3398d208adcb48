"""Each routing policy's parameters: a typed model, validated when the snapshot is compiled.

Unknown parameters are refused, so a typo is a nack with a reason rather than a default
silently in force.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PolicyParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kv_events: bool = Field(
        default=False, description="engines publish KV-cache events; routers use them"
    )
    prefix_index_blocks: int = Field(
        default=65_536, ge=64, le=16_777_216, description="per worker; LRU beyond it"
    )
    prefix_block_bytes: int = Field(default=64, ge=8, le=4096)
    pd_local_max_tokens: int = Field(
        default=256, ge=0, description="PD: prefill on the decode worker at most this uncached"
    )
    pd_local_max_ratio: float = Field(
        default=0.1, ge=0, le=1, description="...or at most this share of the prompt uncached"
    )


class RoundRobinParams(PolicyParams):
    pass


class LeastLoadParams(PolicyParams):
    pass


class PowerOfTwoParams(PolicyParams):
    pass


class CacheAwareParams(PolicyParams):
    """SGLang's router semantics, so that the comparison is like for like."""

    cache_threshold: float = Field(default=0.3, ge=0, le=1)
    balance_abs_threshold: int = Field(default=64, ge=0)
    balance_rel_threshold: float = Field(default=1.5, ge=1)


class CostParams(PolicyParams):
    """The time-based cost router: predicted seconds to first token, cheapest wins."""

    max_kv_usage: float = Field(
        default=1.0, gt=0, le=1, description="veto a worker whose KV pool is fuller; at 1, the "
        "default, none: an engine queues a request until its pool has room, and the wait is "
        "priced",
    )  # fmt: skip
    max_waiting: int = Field(
        default=64, ge=1, description="veto a worker with more requests queued than this"
    )
    prefill_tokens_per_s: float = Field(
        default=20_000, gt=0, description="a worker's prefill rate until it is learned"
    )
    decode_step_s: float = Field(
        default=0.01, gt=0, description="a worker's decode step until it is learned"
    )
    chunk_tokens: int = Field(
        default=8192, ge=64, description="prefill chunk: each costs the running batch a step"
    )
    miss_weight: float = Field(
        default=3.0, ge=0, le=100, description="price of recomputing a prefix another worker "
        "holds, per second of its prefill, beside the request's own TTFT",
    )  # fmt: skip
    tie_s: float = Field(
        default=0.25, ge=0, le=10, description="placing a prefix no worker holds most of: "
        "prices this close are equal, and the worker that draws the least traffic wins",
    )  # fmt: skip
    even_s: float = Field(
        default=0.02, ge=0, le=10, description="a prefix held where it goes: prices this close "
        "are equal, and the worker with the fewest requests wins",
    )  # fmt: skip
    max_unstarted: int = Field(
        default=2, ge=1, le=10_000, description="under a TTFT SLO, requests sent to a worker "
        "that holds requests back for KV room and have not started there, at most: the rest "
        "wait at the gateway, where they can be shed",
    )  # fmt: skip
    itl_knee: float = Field(
        default=0.5, ge=0, lt=1, description="share of the ITL SLO past which a busy worker's "
        "decode step is priced up",
    )  # fmt: skip
    itl_penalty_s: float = Field(
        default=0.0, ge=0, le=100, description="the price, in seconds, of a decode step at the "
        "ITL SLO",
    )  # fmt: skip
    price_answers: bool = Field(
        default=False, description="price a worker by the whole answer, not its first token "
        "alone: the answer's decode at the step of the batch it joins, what it adds to each "
        "step of the answers running there, and the stall its prefill puts on them and on what "
        "it evicts; while no engine of the model queues. Spreads a hot prefix over idle "
        "workers; costs capacity where cache affinity is worth more than a small batch",
    )  # fmt: skip
    max_itl_share: float = Field(
        default=1.0, gt=0, le=10, description="veto a busy worker whose decode step is past "
        "this share of the route's inter-token SLO",
    )  # fmt: skip


POLICY_PARAMS: dict[str, type[PolicyParams]] = {
    "round_robin": RoundRobinParams,
    "least_load": LeastLoadParams,
    "power_of_two": PowerOfTwoParams,
    "cache_aware": CacheAwareParams,
    "cost": CostParams,
}


def params_for(policy: str, raw: dict[str, Any]) -> PolicyParams:
    """Raises KeyError for an unknown policy, ValidationError for bad parameters."""
    model = POLICY_PARAMS[policy]
    return model.model_validate(raw)
