"""Routing policies: pure decisions over candidates. A policy ranks the candidate workers for a
request (best first), says why, and may learn from what it dispatched (its prefix index).

One instance per (model, policy, parameters) lives on across snapshots while these are
unchanged, so its prefix state survives a snapshot that changes something else.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field

from meridian_pb.fleet.v1.params import CacheAwareParams, CostParams, PolicyParams

from agents.config import WorkerSpec
from agents.router import predict
from agents.router.view import WorkerView
from agents.workers.prefix import PrefixIndex
from agents.workers.table import WorkerEntry


@dataclass
class RouteRequest:
    model: str
    key: bytes  # what the prefix index matches: the prompt as the engine will see it
    prompt_tokens: int  # estimated
    tokens_per_byte: float  # the model's, learned from usage (1/4 when the key is token ids)
    hashes: list[int] = field(default_factory=list)
    exact: PrefixIndex | None = None  # the index KV-cache events keep, when the key is tokens
    itl_limit_s: float | None = None  # the route's inter-token SLO
    max_new: int | None = None  # the answer's most tokens (max_tokens), when it sets one
    now: float = 0.0  # the router's clock when it is routed
    full: bool = False  # requests of its model have lately waited in admission for room
    root: int = 0  # where its prefix's chain starts: its cache namespace (prefix.salt_root)
    whole: bool = False  # its answer comes whole (not streamed): no byte of it before its end
    service_class: int = 1  # its class (ServiceClass: 0 interactive .. 3 batch)
    adapter: str | None = None  # the LoRA adapter it names
    cold_load_s: float = 0.0  # what loading its adapter where it is not held takes


@dataclass
class Candidate:
    worker: WorkerSpec
    entry: WorkerEntry
    view: WorkerView
    matched_tokens: int = 0
    ttft_s: float = 0.0  # predicted time to first token (cost policy)
    decode_s: float = 0.0  # predicted time from its first token to its last (cost policy)
    score_s: float = 0.0  # what the cost policy ranks by: its latency and what it costs others
    veto: str = ""
    cold_s: float = 0.0  # loading the request's adapter first, where it is not held

    @property
    def busy(self) -> bool:
        """Running requests, or requests sent there since the poll or not yet answered."""
        return self.entry.load.running + self.view.sent_since_poll > 0 or self.view.inflight > 0

    @property
    def load(self) -> int:
        """Requests at the engine: as polled, plus what this gateway sent since."""
        polled = self.entry.load.running + self.entry.load.waiting + self.view.sent_since_poll
        return max(polled, self.view.inflight)


@dataclass
class Ranking:
    ranked: list[Candidate]  # best first; vetoed workers left out
    reason: str
    vetoed: list[Candidate] = field(default_factory=list)


class Policy:
    name = "policy"
    uses_prefix = False

    def __init__(self, params: PolicyParams) -> None:
        self.params = params
        self.index = PrefixIndex(params.prefix_block_bytes, params.prefix_index_blocks)

    def rank(self, candidates: list[Candidate], request: RouteRequest) -> Ranking:
        raise NotImplementedError

    def index_for(self, request: RouteRequest) -> PrefixIndex:
        return request.exact if request.exact is not None else self.index

    def dispatched(self, worker_id: str, request: RouteRequest) -> None:
        if self.uses_prefix:  # what it will hold once prefilled; events correct it
            self.index_for(request).insert(worker_id, request.hashes)

    def match(self, candidates: list[Candidate], request: RouteRequest) -> None:
        """Fill in each candidate's matched prompt tokens from the prefix index."""
        index = self.index_for(request)
        if not request.hashes:  # once a request: a waiting request is placed again and again
            request.hashes = index.hashes(request.key, request.root)
        blocks = index.match(request.hashes)
        per_block = index.block_bytes * request.tokens_per_byte
        for c in candidates:
            c.matched_tokens = min(
                request.prompt_tokens, int(blocks.get(c.worker.id, 0) * per_block)
            )


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, params: PolicyParams) -> None:
        super().__init__(params)
        self._next = itertools.count()

    def rank(self, candidates: list[Candidate], request: RouteRequest) -> Ranking:
        ordered = sorted(candidates, key=lambda c: c.worker.id)
        start = next(self._next) % len(ordered)
        return Ranking(ordered[start:] + ordered[:start], "next in turn")


class LeastLoad(Policy):
    name = "least_load"

    def rank(self, candidates: list[Candidate], request: RouteRequest) -> Ranking:
        random.shuffle(candidates)  # ties go anywhere, not always to the first
        return Ranking(sorted(candidates, key=lambda c: c.load), "fewest requests")


class PowerOfTwo(Policy):
    name = "power_of_two"

    def rank(self, candidates: list[Candidate], request: RouteRequest) -> Ranking:
        pair = random.sample(candidates, min(2, len(candidates)))
        pair.sort(key=lambda c: c.load)
        rest = sorted((c for c in candidates if c not in pair), key=lambda c: c.load)
        return Ranking(pair + rest, "lighter of two at random")


class CacheAware(Policy):
    """SGLang router's cache_aware: balance when loads are far apart, else the longest prefix
    match above the threshold, else the worker with the smallest cache."""

    name = "cache_aware"
    uses_prefix = True

    def rank(self, candidates: list[Candidate], request: RouteRequest) -> Ranking:
        p = self.params
        assert isinstance(p, CacheAwareParams)
        self.match(candidates, request)
        loads = [c.view.inflight for c in candidates]
        high, low = max(loads), min(loads)
        by_load = sorted(candidates, key=lambda c: (c.view.inflight, c.worker.id))
        if high - low > p.balance_abs_threshold and high > low * p.balance_rel_threshold:
            return Ranking(by_load, f"balance: in flight {low}..{high}")
        best = max(candidates, key=lambda c: (c.matched_tokens, -c.view.inflight))
        rate = best.matched_tokens / request.prompt_tokens if request.prompt_tokens else 0.0
        if rate > p.cache_threshold:
            rest = [c for c in by_load if c is not best]
            return Ranking([best, *rest], f"prefix match {rate:.2f} > {p.cache_threshold}")
        index = self.index_for(request)
        smallest = sorted(candidates, key=lambda c: (index.size(c.worker.id), c.view.inflight))
        return Ranking(smallest, f"prefix match {rate:.2f}: smallest cache")


class Cost(Policy):
    """Predicted seconds to first token per worker: the prefill queued there, plus this
    request's uncached prompt at the worker's learned prefill rate, plus a decode step of the
    running batch for each prefill chunk. When the engine's KV pool is short, the queue waits
    for running requests to finish and free room for it and for this request's uncached
    prompt: a prefix recomputed on a full worker waits longer than a hit there.

    Cheapest wins, where the price of a worker is its predicted TTFT plus `miss_weight` times
    the prefill it would do that another worker would not (its uncached tokens beyond the best
    match's): recomputing a prefix takes capacity from every later request there, and puts a
    second copy in a cache that must evict something for it. Added to that, the delay its
    prefill causes the requests expected to queue behind it there: the worker's queue smoothed
    over seconds (work added to a busy server delays about rho / (1 - rho) others), so a busy
    fleet keeps each prefix where it is cached while an idle worker still takes load off a hot
    one. A greedy TTFT alone leaves a cached worker as soon as it has a little queue, and
    under load spreads every prefix over every worker. Cache affinity is never gated on
    request counts (sglang issue #21199). For a prefix that no worker holds, prices within
    `tie_s` are equal: the worker drawing the least traffic wins, since a prefix new there
    shares that traffic from then on (cache affinity makes today's choice of a worker for a
    new prefix the load of its later requests). A prefix already held goes by price; prices
    within `even_s`, the model's own noise, go to the worker with the fewest requests.

    A busy worker whose learned decode step is past `itl_knee` of the route's inter-token SLO
    is priced up, smoothly (`itl_penalty_s` at the SLO), so that load moves off a worker
    whose batch has grown before its tokens break the SLO, not after; cache affinity alone
    would keep a prefix's requests on it whatever its batch.

    With `price_answers`, the price is of the whole answer (`_answer_price`): its decode at
    the step of the batch it joins, what it adds to the steps of the answers there, and the
    stall its prefill puts on them; while the model is not full (no engine queues, and no
    request of it has lately waited in admission: then prefill binds, and a copy takes
    capacity that others wait for). A hot prefix then spreads to an idle worker once its
    holder's batch slows every answer there by more than a prefill. Off by default: at
    moderate load on the shared-prefix benchmark its copies cost hit rate (bench/README.md).

    Vetoed: a worker whose queue (or KV pool, if configured) is past its limit, and a busy
    worker whose learned decode step is near the route's inter-token SLO while another's is
    not: more work there would break the SLO of all it runs (the other face of a hot spot)."""

    name = "cost"
    uses_prefix = True

    def rank(self, candidates: list[Candidate], request: RouteRequest) -> Ranking:
        p = self.params
        assert isinstance(p, CostParams)
        self.match(candidates, request)
        best_match = max(c.matched_tokens for c in candidates)
        limit = request.itl_limit_s * p.max_itl_share if request.itl_limit_s else None
        slow: list[Candidate] = []
        # answers are priced while the engines keep up: once one queues, or requests wait
        # here for room, prefill is what binds, and a prefix copied to shorten a batch takes
        # capacity others wait for
        answers = (
            p.price_answers
            and not request.full
            and not any(c.entry.load.waiting for c in candidates)
        )
        if answers:
            # how long its answer will be: one guess for every worker (each learns answers'
            # length from what it served; one that served short ones is no faster for this)
            tokens = sum(c.view.answer(request.max_new) for c in candidates) / len(candidates)
            index = self.index_for(request)
            per_block = index.block_bytes * request.tokens_per_byte
        for c in candidates:
            load, view = c.entry.load, c.view
            busy = c.busy
            if load.kv_usage > p.max_kv_usage:
                c.veto = f"kv usage {load.kv_usage:.2f} > {p.max_kv_usage}"
            elif load.waiting + view.sent_since_poll > p.max_waiting:
                c.veto = f"queue {load.waiting + view.sent_since_poll} > {p.max_waiting}"
            elif limit is not None and busy and view.decode_step_s > limit:
                slow.append(c)
            uncached = request.prompt_tokens - c.matched_tokens
            ahead = predict.queued_work(view, load.pending_tokens)
            steps = math.ceil((ahead + uncached) / p.chunk_tokens) if busy else 0
            # the queue ahead is served as fast as its prefill and the pool's room allow
            answer = view.answer(request.max_new)
            room = predict.room_wait(view, uncached, load, request.now, answer)
            wait = max(ahead / view.prefill_tokens_per_s, room)
            c.ttft_s = wait + uncached / view.prefill_tokens_per_s + steps * view.decode_step_s
            c.ttft_s += c.cold_s  # its adapter loaded first, where it is not held
            recompute = (best_match - c.matched_tokens) / view.prefill_tokens_per_s
            # what this prefill costs the requests queued there, each waiting the longer: the
            # queue expected there is what work added to a busy server delays (rho / (1 - rho))
            queue = max(view.queue, load.waiting) + view.sent_since_poll
            c.score_s = c.ttft_s + p.miss_weight * recompute
            c.score_s += queue * uncached / view.prefill_tokens_per_s
            if answers:
                cached = index.size(c.worker.id) * per_block
                c.score_s += _answer_price(c, request, uncached, tokens, queue, cached)
            if request.itl_limit_s and busy:  # tokens coming near the ITL SLO: priced up
                pressure = view.decode_step_s / request.itl_limit_s - p.itl_knee
                if pressure > 0:
                    c.score_s += p.itl_penalty_s * (pressure / (1 - p.itl_knee)) ** 2
        if len(slow) < sum(1 for c in candidates if not c.veto):  # others are not slow
            for c in slow:
                c.veto = f"decode step {c.view.decode_step_s * 1000:.0f} ms near the ITL SLO"
        ok = [c for c in candidates if not c.veto]
        vetoed = [c for c in candidates if c.veto]
        ok.sort(key=lambda c: (c.score_s, c.load, c.worker.id))
        if not ok:
            return Ranking([], "every worker vetoed", vetoed)
        # a prefix new to the cheapest, at near-equal prices among workers that hold as much of
        # it: the one drawing the least traffic, which the prefix shares for as long as
        # affinity keeps it there. A prefix already held is priced, not placed: there the
        # predicted wait decides, and tie_s is long beside a hit's TTFT.
        top = ok[0]
        close = [
            c for c in ok
            if c.score_s - top.score_s <= p.tie_s and c.matched_tokens >= top.matched_tokens
        ]  # fmt: skip
        if len(close) > 1 and places(top, request):
            draw = _draws(close, request.now)
            close.sort(key=lambda c: (draw[c.worker.id], c.score_s, c.worker.id))
            ok = close + [c for c in ok if c.worker.id not in draw]
        elif len(close) > 1:
            # prices closer than the model's error (the decode step it knows lags the batch
            # it runs now): the fewest requests at the engine, each slowing every step there
            near = [c for c in close if c.score_s - top.score_s <= p.even_s]
            near.sort(key=lambda c: (c.load, c.score_s, c.worker.id))
            first = {c.worker.id for c in near}
            ok = near + [c for c in ok if c.worker.id not in first]
        best = ok[0]
        return Ranking(
            ok,
            f"cheapest predicted ttft {best.ttft_s * 1000:.0f} ms, {best.matched_tokens} "
            f"of {request.prompt_tokens} tokens cached",
            vetoed,
        )


def _answer_price(
    c: Candidate, request: RouteRequest, uncached: int, tokens: float, queue: float, cached: float
) -> float:
    """What the rest of the answer costs there, in seconds (`price_answers`): the answer's
    own decode, a token a step of the batch it joins; what it adds to each step of the
    answers running there while it runs beside them; and the stall its prefill puts on the
    running batch (a prefill step is a step none of them decodes) and, in a full cache, on a
    later request that recomputes what it evicts. Cache affinity alone keeps a hot prefix's
    requests on one worker, each slower for the others, while another stands idle."""
    load, view = c.entry.load, c.view
    c.decode_s = tokens * predict.step_at(view, c.load + 1)
    slope = view.line.slope() or 0.0
    price = c.decode_s + slope * min(
        predict.to_come(view, load, request.now), load.running * tokens
    )
    price += load.running * uncached / view.prefill_tokens_per_s
    if load.max_total_tokens > 0 and uncached > 0:
        free = load.max_total_tokens - load.used_tokens - cached
        evicts = min(uncached, max(0.0, uncached - free))
        price += (queue + load.running + 1) * evicts / view.prefill_tokens_per_s
    return price


def places(c: Candidate, request: RouteRequest) -> bool:
    """Whether sending the request to `c` places its prefix there: most of it is not cached."""
    return c.matched_tokens * 2 < request.prompt_tokens


def _draws(among: list[Candidate], now: float) -> dict[str, float]:
    """Each worker's share of the traffic it will draw, among these: what it draws now, plus
    what the prefixes new to it lately will draw once their later requests follow them."""
    rates = {c.worker.id: c.view.rate(now) for c in among}
    placed = {c.worker.id: c.view.placed(now) for c in among}
    total_rate, total_placed = sum(rates.values()) or 1.0, sum(placed.values()) or 1.0
    return {w: rates[w] / total_rate + placed[w] / total_placed for w in rates}


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (RoundRobin, LeastLoad, PowerOfTwo, CacheAware, Cost)
}
