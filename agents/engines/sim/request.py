"""What the simulated scheduler works on: a request and its progress, the faults in force,
and what the engine reports as it goes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agents.engines.sim.radix import Node, namespace_parts

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
    poison: str | None = None  # a request holding it kills the engine
    output: Literal["none", "garbage", "repeat"] = "none"  # what answers are made of
    logprob_shift: float = 0.0  # wrong weights: log-probabilities this much lower on average

    @property
    def shift(self) -> float:
        """The log-probability shift in force: a worker emitting garbage computes wrong too."""
        return self.logprob_shift + (5.0 if self.output != "none" else 0.0)


@dataclass(frozen=True)
class Priority:
    """SGLang's priority scheduling (`--enable-priority-scheduling`): the queue is taken in
    order of priority (higher first, or lower with `low_first`), then of arrival; and when
    every slot is taken, a request whose priority is more than `threshold` above running ones
    retracts the lowest of them (the newest first) while that frees what it needs, unless
    `preempt` is off. A retracted request waits again; it is not lost."""

    default: int | None = None  # a request's that names none (SGLang: the lowest there is)
    low_first: bool = False
    preempt: bool = True
    threshold: int = 10
    retract_by_priority: bool = False  # `--retraction-policy priority`: the lowest retracted first

    def of(self, asked: int | None) -> int:
        if asked is not None:
            return asked
        if self.default is not None:
            return self.default
        return sys.maxsize if self.low_first else -sys.maxsize - 1

    def rank(self, priority: int) -> int:
        """A sort key: smaller is served first."""
        return priority if self.low_first else -priority

    def victims(
        self, request: Request, running: list[Request], need: int, reserve: Callable[[Request], int]
    ) -> list[Request]:
        """Of `running`, those `request` retracts for the `need` tokens it lacks: of a
        priority more than the threshold below its own, the lowest and newest first, until
        what they hold (and their `reserve`) covers it; none if they cannot."""
        rank, mine = self.rank, self.rank(request.priority or 0)
        victims: list[Request] = []
        for one in sorted(running, key=lambda r: (-rank(r.priority or 0), -r.queued)):
            if rank(one.priority or 0) - mine <= self.threshold:
                break
            victims.append(one)
            need -= one.context + reserve(one)
            if need <= 0:
                return victims
        return victims if victims and need <= 0 else []


@dataclass(eq=False)
class Request:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    arrived: float
    salt: str | None = None  # its cache namespace: its `cache_salt` and its LoRA adapter
    prefilled: bool = False  # PD decode: the KV cache came from a prefill server
    streaming: bool = False  # its answer is streamed (metrics' `is_streaming`)
    priority: int | None = None  # with priority scheduling on: its priority (else None)
    # in the metrics (SGLang's health generations are not: `log_metrics=False`)
    log_metrics: bool = True
    queued: float = 0.0  # when it last joined the queue (a preempted request joins again)
    output: list[int] = field(default_factory=list)
    generated: int = 0
    cached: int = 0  # prompt tokens found in the cache when first admitted
    computed: int = 0  # tokens of `sequence` whose KV is in the cache
    fresh: int = 0  # generated tokens whose KV is in the pool but not yet in the cache
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

    @property
    def adapter(self) -> str | None:
        """Its LoRA adapter (None: the base model)."""
        return namespace_parts(self.salt)[1]

    def sequence(self) -> list[int]:
        """What a prefill computes: the prompt, and after a retraction what it generated."""
        return self.prompt + self.output[: self.generated] if self.generated else self.prompt


class Observer:
    """What the engine reports as it goes; the metrics implement it."""

    def admitted(self, request: Request) -> None: ...
    def first_token(self, request: Request) -> None: ...
    def finished(self, request: Request) -> None: ...
