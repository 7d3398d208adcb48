"""The simulated scheduler: continuous batching over a radix cache, with calibrated costs.

Like SGLang's scheduler it keeps a waiting queue and a running batch. Each turn it admits
waiting requests while the batch has room and the KV pool can hold their prompts, and runs
one prefill step for them (cost per uncached token); otherwise it runs one decode step for
the whole batch (cost per batch and context). Finished sequences stay in the radix cache
for later requests to reuse, until LRU eviction needs the room.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from agents.engines.sim import tokens
from agents.engines.sim.cost import CostModel
from agents.engines.sim.radix import Node, RadixCache

CATCH_UP_S = 0.05
Role = Literal["unified", "prefill", "decode"]
Finish = Literal["length", "abort"]


class EngineBusy(Exception):
    """The cache cannot be flushed while requests run."""


class InjectedError(Exception):
    """The error-rate fault picked this request."""


@dataclass
class Faults:
    slow_factor: float = 1.0
    error_rate: float = 0.0
    hang: bool = False


@dataclass(eq=False)
class Request:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    arrived: float
    prefilled: bool = False  # PD decode: the KV cache came from a prefill server
    output: list[int] = field(default_factory=list)
    generated: int = 0
    cached: int = 0
    admitted: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    finish: Finish | None = None
    node: Node | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # progress readers clear it
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def context(self) -> int:
        return len(self.prompt) + self.generated


class Observer:
    """What the engine reports as it goes; the metrics implement it."""

    def admitted(self, request: Request) -> None: ...
    def first_token(self, request: Request) -> None: ...
    def finished(self, request: Request) -> None: ...


class Engine:
    def __init__(
        self,
        *,
        cost: CostModel,
        max_running: int,
        stream_interval: int = 1,
        role: Role = "unified",
        faults: Faults | None = None,
        observer: Observer | None = None,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.cost = cost
        self.max_running = max_running
        self.stream_interval = max(1, stream_interval)
        self.role = role
        self.faults = faults or Faults()
        self.observer = observer or Observer()
        self._clock = clock or asyncio.get_running_loop().time
        self._sleep = sleep
        self._random = random.Random(seed)
        self.cache = RadixCache(cost.max_total_tokens, self._clock)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._wake = asyncio.Event()
        self._unhung = asyncio.Event()
        self._unhung.set()
        self._ids = itertools.count()
        self.generated_total = 0
        self._deadline = 0.0

    def now(self) -> float:
        return self._clock()

    def new_request(
        self, prompt: list[int], max_new_tokens: int, rid: str | None = None
    ) -> Request:
        if self._random.random() < self.faults.error_rate:
            raise InjectedError("injected fault: error rate")
        request = Request(rid or f"sim-{next(self._ids)}", prompt, max_new_tokens, self.now())
        request.output = tokens.output_ids(tokens.prompt_seed(prompt), max_new_tokens)
        return request

    def submit(self, request: Request) -> None:
        self.waiting.append(request)
        self._wake.set()

    def abort(self, request: Request) -> None:
        if request.done:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
            self._release(request)
        self._finish(request, "abort")

    def abort_all(self) -> int:
        victims = [*self.waiting, *self.running]
        for request in victims:
            self.abort(request)
        return len(victims)

    def flush(self) -> None:
        if self.waiting or self.running:
            raise EngineBusy("requests are running")
        self.cache.reset()

    def set_hang(self, hang: bool) -> None:
        self.faults.hang = hang
        if hang:
            self._unhung.clear()
        else:
            self._unhung.set()

    async def until_unhung(self) -> None:
        await self._unhung.wait()

    @property
    def used_tokens(self) -> int:
        return self.cache.size + sum(r.generated for r in self.running)

    async def run(self) -> None:
        """The scheduling loop; runs until cancelled."""
        while True:
            await self._unhung.wait()
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            admitted = self._admit()
            if admitted:
                await self._prefill(admitted)
            elif self.running:
                await self._decode()
            else:  # nothing fits yet: let finishing requests free the pool
                self._wake.clear()
                await self._wake.wait()

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        while self.waiting and len(self.running) < self.max_running:
            request = self.waiting[0]
            cached, _ = self.cache.match(request.prompt)
            self.cache.insert(request.prompt)
            held, node = self.cache.match(request.prompt)
            if held < len(request.prompt) and self.running:
                break  # the pool is full of running sequences; wait for one to finish
            self.waiting.popleft()
            self.cache.lock(node)
            request.node = node
            request.cached = len(request.prompt) if request.prefilled else cached
            request.admitted = self.now()
            self.running.append(request)
            self.observer.admitted(request)
            if not request.prefilled:
                admitted.append(request)
        return admitted

    async def _prefill(self, batch: list[Request]) -> None:
        uncached = sum(len(r.prompt) - r.cached for r in batch)
        await self._step(self.cost.prefill(uncached))
        for request in batch:
            if request.done:
                continue
            if request.max_new_tokens > 0:
                self._advance(request)
            # A prefill server hands over after the first token; the decode server goes on.
            if not request.done and (self.role == "prefill" or request.max_new_tokens == 0):
                self._complete(request)

    async def _decode(self) -> None:
        batch = list(self.running)
        context = sum(r.context for r in batch)
        await self._step(self.cost.decode_step(len(batch), context))
        for request in batch:
            if not request.done:
                self._advance(request)

    async def _step(self, seconds: float) -> None:
        """Steps keep time against a deadline, so the timer's lateness does not add up; after
        an idle spell (or a lag of more than CATCH_UP_S) the deadline starts again from now."""
        now = self.now()
        if now - self._deadline > CATCH_UP_S:
            self._deadline = now
        self._deadline += seconds * self.faults.slow_factor
        await self._sleep(self._deadline - now)
        await self._unhung.wait()

    def _advance(self, request: Request) -> None:
        request.generated += 1
        self.generated_total += 1
        if request.generated == 1:
            request.first_token_at = self.now()
            self.observer.first_token(request)
            request.changed.set()
        if request.generated >= request.max_new_tokens:
            self._complete(request)
        elif request.generated % self.stream_interval == 0:
            request.changed.set()

    def _complete(self, request: Request) -> None:
        self.running.remove(request)
        self._release(request)
        self.cache.insert(request.prompt + request.output[: request.generated])
        self._finish(request, "length")
        self._wake.set()

    def _release(self, request: Request) -> None:
        if request.node is not None:
            self.cache.unlock(request.node)
            request.node = None

    def _finish(self, request: Request, finish: Finish) -> None:
        request.finish = finish
        request.finished_at = self.now()
        self.observer.finished(request)
        request.changed.set()
        request.ended.set()
