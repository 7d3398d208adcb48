"""The simulated scheduler: continuous batching over a radix cache, with calibrated costs.

It follows SGLang's scheduler where routing depends on it:

- **Prefill batches are capped.** Each prefill step takes waiting requests in order while the
  step's budget lasts (`--max-prefill-tokens` input tokens, `--chunked-prefill-size` a
  chunk). A prompt longer than what is left is cut: its first chunk runs now, the rest in
  the next steps, ahead of anything new. A long queue is served over several steps
  (prefill.py).
- **Only computed prefixes are cache hits.** A request matches the radix cache as it is
  before its step; prefixes computed in the same step are not shared (each request pays for
  its own), and a chunk enters the cache once its step has run.
- **The KV pool holds prompts and generated tokens.** A request is admitted only if its
  uncached chunk, plus the decode tokens reserved for everything running (the remaining
  output times a new-token ratio that starts at 0.7 and decays to 0.1, as SGLang's), fits
  the free pool after evicting unused prefixes. When a decode step finds no room for the
  batch's next tokens, a request is retracted to the front of the queue (the shortest answer
  so far; with `--retraction-policy priority`, the lowest priority first): what it had
  computed is kept in the cache while room lasts, and the ratio goes back to 0.7
  (retraction.py).
- A step is a prefill step when something can be admitted, else a decode step for the whole
  running batch (SGLang without mixed chunking).
- **Priority scheduling**, when on (`Priority`): the queue is taken by priority, then by when
  each joined it (a request retracted for lack of room keeps its place, a preempted one joins
  again); a request that finds every slot taken retracts running requests of a priority more
  than the threshold below its own (the lowest, the newest first) when that frees what it
  needs, as SGLang's `preempt_to_schedule` does.
- **LoRA adapters per batch**, with LoRA on: the running batch holds requests of at most
  `--max-loras-per-batch` adapters (the base model counting as one); a waiting request of
  another adapter is passed over for later ones until the batch has room for it, as SGLang's
  `can_schedule_lora_req` does.

Finished sequences stay in the radix cache for later requests, until LRU eviction needs room.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Literal

from agents.engines.sim import prefill, retraction, tokens
from agents.engines.sim.cost import CostModel
from agents.engines.sim.radix import Listener, RadixCache
from agents.engines.sim.request import (
    EngineBusy,
    Faults,
    Finish,
    InjectedError,
    Observer,
    Priority,
    Request,
)
from agents.engines.sim.retraction import INIT_NEW_TOKEN_RATIO
from agents.engines.sim.stats import StepStats

CATCH_UP_S = 0.05
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
Role = Literal["unified", "prefill", "decode"]


class Engine:
    def __init__(
        self,
        *,
        cost: CostModel,
        max_running: int,
        stream_interval: int = 1,
        role: Role = "unified",
        max_prefill_tokens: int = 16384,
        chunked_prefill_size: int = 8192,
        speed: float = 1.0,
        faults: Faults | None = None,
        observer: Observer | None = None,
        seed: int = 0,
        priority: Priority | None = None,
        listener: Listener | None = None,
        max_loras_per_batch: int | None = None,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.cost = cost
        self.max_running = max_running
        self.stream_interval = max(1, stream_interval)
        self.role = role
        self.max_prefill_tokens = max_prefill_tokens
        self.chunk_size = chunked_prefill_size if chunked_prefill_size > 0 else 1 << 30
        self.speed = speed
        self.faults = faults or Faults()
        self.observer = observer or Observer()
        self.priority = priority
        self.max_loras_per_batch = max_loras_per_batch  # None: LoRA is off
        self._clock = clock or asyncio.get_running_loop().time
        self._sleep = sleep
        self._random = random.Random(seed)
        self.noise = random.Random(seed + 1)  # the log-probabilities' run-to-run spread
        self.cache = RadixCache(cost.max_total_tokens, self._clock, listener)
        self.waiting: deque[Request] = deque()
        self.decoding: list[Request] = []
        self.chunked: Request | None = None  # a prompt part-way through chunked prefill
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.retracted_total = 0  # for want of KV room (SGLang counts these alone)
        self.preempted_total = 0  # retracted for a request of a higher priority
        self._wake = asyncio.Event()
        self._aborting: list[str | None] = []  # rids asked to stop (None: all), see `abort_soon`
        self._unhung = asyncio.Event()
        self._unhung.set()
        self._ids = itertools.count()
        self.stats = StepStats()
        self.busy_s = 0.0  # the steps' time: what its GPU would have worked
        self._pool_generated = 0  # generated tokens held outside the cache
        self._deadline = 0.0

    def now(self) -> float:
        return self._clock()

    @property
    def running(self) -> list[Request]:
        """Requests holding KV: the decode batch and a prompt in chunked prefill."""
        return [*self.decoding, self.chunked] if self.chunked else list(self.decoding)

    @property
    def held_tokens(self) -> int:
        """KV pool slots taken: the whole cache (evictable or not) and generated tokens."""
        return self.cache.size + self._pool_generated

    @property
    def used_tokens(self) -> int:
        """What SGLang reports as used (`num_used_tokens`, `token_usage`, `/get_load`): the
        pool less what is free and less the cache that could be evicted."""
        return self.cache.protected + self._pool_generated

    @property
    def capacity(self) -> int:
        """The KV pool: the cache's capacity is what generated tokens leave of it."""
        return self.cost.max_total_tokens

    @property
    def pending_tokens(self) -> int:
        """Prompt tokens waiting to be prefilled."""
        rest = len(self.chunked.prompt) - self.chunked.computed if self.chunked else 0
        return rest + sum(len(r.prompt) - r.computed for r in self.waiting)

    def new_request(
        self, prompt: list[int], max_new_tokens: int, rid: str | None = None,
        salt: str | None = None,
    ) -> Request:  # fmt: skip
        if self._random.random() < self.faults.error_rate:
            raise InjectedError("injected fault: error rate")
        request = Request(rid or f"sim-{next(self._ids)}", prompt, max_new_tokens, self.now(),
                          salt=salt or None)  # fmt: skip
        request.output = tokens.output_ids(prompt, max_new_tokens, self.faults.output)
        return request

    def submit(self, request: Request) -> None:
        request.priority = self.priority.of(request.priority) if self.priority else None
        request.queued = self.now()
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: Request) -> None:
        if request.done:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        elif request is self.chunked:
            self.chunked = None
            self.release(request)
        elif request in self.decoding:
            self.decoding.remove(request)
            self.release(request)
        self.finish(request, "abort")
        self._wake.set()

    def abort_soon(self, rid: str | None) -> None:
        """`/abort_request`, as SGLang 0.5.23 serves it: the abort goes to the scheduler,
        which drops the request (every request, for None) between its steps. Until then the
        rid is still the engine's: a request naming it is refused as a duplicate."""
        self._aborting.append(rid)
        self._wake.set()

    def _take_aborts(self) -> None:
        aborting, self._aborting = self._aborting, []
        for rid in aborting:
            if rid is None:
                self.abort_all()
                continue
            for victim in [*self.waiting, *self.running]:
                if victim.rid == rid:
                    self.abort(victim)

    def abort_all(self) -> int:
        victims = [*self.waiting, *self.running]
        for request in victims:
            self.abort(request)
        return len(victims)

    def flush(self) -> None:
        if self.waiting or self.running:
            raise EngineBusy("requests are running")
        self.cache.reset()
        self._wake.set()  # publish the clearing

    def set_hang(self, hang: bool) -> None:
        self.faults.hang = hang
        if hang:
            self._unhung.clear()
        else:
            self._unhung.set()

    async def until_unhung(self) -> None:
        await self._unhung.wait()

    async def run(self) -> None:
        """The scheduling loop; runs until cancelled."""
        while True:
            await self._unhung.wait()
            self._wake.clear()  # before publishing: a wake while it publishes is kept
            self._take_aborts()
            await self.cache.listener.flush()  # the last step's KV-cache events, if published
            if not self.waiting and not self.running:
                await self._wake.wait()
                self.stats.idle(self.now())
                continue
            batch = prefill.next_batch(self)
            if batch:
                await self._prefill(batch)
            elif self.decoding:
                await self._decode()
            else:  # nothing fits yet: let finishing requests free the pool
                await self._wake.wait()

    # -- prefill ---------------------------------------------------------------------------

    def reserve(self, request: Request) -> int:
        return math.ceil(self.new_token_ratio * (request.max_new_tokens - request.generated))

    def start(self, request: Request, matched: int) -> None:
        request.computed = matched
        _, node = self.cache.match(request.sequence()[:matched], request.salt)
        self.cache.lock(node)
        request.node = node
        if request.admitted is None:
            request.cached = matched if not request.prefilled else len(request.prompt)
            request.admitted = self.now()
            if request.log_metrics:
                self.observer.admitted(request)

    def hold(self, request: Request, sequence: list[int]) -> None:
        """The first `computed` tokens of the sequence enter the cache; hold them there."""
        self.cache.insert(sequence[: request.computed], request.salt)
        _, node = self.cache.match(sequence[: request.computed], request.salt)
        self.cache.lock(node)
        if request.node is not None:
            self.cache.unlock(request.node)
        request.node = node

    async def _prefill(self, batch: list[tuple[Request, int]]) -> None:
        tokens = sum(take for _, take in batch)
        self.stats.prefilled(tokens, await self._step(self.cost.prefill(tokens)))
        for request, take in batch:
            if request.done:
                continue
            sequence = request.sequence()
            request.computed += take
            self.hold(request, sequence)
            if request.computed < len(sequence):
                continue  # more chunks to come
            if request is self.chunked:
                self.chunked = None
            if request.max_new_tokens == 0:
                self._complete(request)
                continue
            self.decoding.append(request)
            if request.generated == 0:
                self._advance(request)
            # A prefill server hands over after the first token; the decode server goes on.
            if not request.done and self.role == "prefill":
                self._complete(request)

    # -- decode ----------------------------------------------------------------------------

    async def _decode(self) -> None:
        retraction.make_room(self, len(self.decoding))
        batch = list(self.decoding)
        if not batch:
            return
        context = sum(r.context for r in batch)
        decayed = self.new_token_ratio - NEW_TOKEN_RATIO_DECAY
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, decayed)
        step_s = await self._step(self.cost.decode_step(len(batch), context))
        before = self.stats.generated_total
        for request in batch:
            if not request.done:
                self._advance(request)
        generated = self.stats.generated_total - before
        self.stats.decoded(len(batch), step_s, generated, self.now())

    async def _step(self, seconds: float) -> float:
        """Steps keep time against a deadline, so the timer's lateness does not add up; after
        an idle spell (or a lag of more than CATCH_UP_S) the deadline starts again from now.
        The step's (simulated) busy time."""
        now = self.now()
        if now - self._deadline > CATCH_UP_S:
            self._deadline = now
        busy = seconds * self.faults.slow_factor / self.speed
        self.busy_s += busy
        self._deadline += busy
        await self._sleep(self._deadline - now)
        await self._unhung.wait()
        return busy

    def _advance(self, request: Request) -> None:
        request.generated += 1
        self.stats.generated_total += 1
        request.fresh += 1
        self._pool_generated += 1
        self.cache.capacity -= 1
        if request.generated == 1:
            request.first_token_at = self.now()
            if request.log_metrics:
                self.observer.first_token(request)
            request.changed.set()
        if request.generated >= request.max_new_tokens:
            self._complete(request)
        elif request.generated % self.stream_interval == 0:
            request.changed.set()

    def _complete(self, request: Request) -> None:
        if request in self.decoding:
            self.decoding.remove(request)
        self.release(request)
        self.cache.insert(request.sequence(), request.salt)
        self.finish(request, "length")
        self._wake.set()

    def release(self, request: Request) -> None:
        """The request lets go of its cached prefix and its generated tokens' pool slots."""
        if request.node is not None:
            self.cache.unlock(request.node)
            request.node = None
        self._pool_generated -= request.fresh
        self.cache.capacity += request.fresh  # the cache may use what the pool gave back
        request.fresh = 0

    def finish(self, request: Request, finish: Finish) -> None:
        request.finish = finish
        request.finished_at = self.now()
        if request.log_metrics:
            self.observer.finished(request)
        request.changed.set()
        request.ended.set()
