"""The simulated scheduler's prefill step, as SGLang's `PrefillAdder` builds it: waiting
requests taken in queue order (by priority first, when on) while the step's budget lasts
(`--max-prefill-tokens` input tokens, `--chunked-prefill-size` a chunk) and the KV pool has
room for each one's uncached chunk and decode reserve; a prompt longer than what is left is
cut, its first chunk now and the rest ahead of anything new. With LoRA, a request of an
adapter the batch has no room for (`--max-loras-per-batch`) is passed over, keeping its
place."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from agents.engines.sim import retraction
from agents.engines.sim.request import Request

if TYPE_CHECKING:
    from agents.engines.sim.engine import Engine


def room_for(engine: Engine) -> int:
    """Tokens a new chunk may take: free and evictable pool, less the decode reserve."""
    free = engine.capacity - engine.held_tokens + engine.cache.evictable
    return free - sum(engine.reserve(r) for r in engine.running)


def next_batch(engine: Engine) -> list[tuple[Request, int]]:
    """The next prefill step: (request, tokens to compute now), in queue order."""
    if engine.priority is not None and len(engine.waiting) > 1:
        rank = engine.priority.rank
        engine.waiting = deque(
            sorted(engine.waiting, key=lambda r: (rank(r.priority or 0), r.queued))
        )
    room = room_for(engine)
    chunk_left, input_left = engine.chunk_size, engine.max_prefill_tokens
    batch: list[tuple[Request, int]] = []
    if engine.chunked is not None:
        request = engine.chunked
        if not engine.decoding:  # nothing else will free the pool: the reserve can wait
            room = engine.capacity - engine.held_tokens + engine.cache.evictable
        take = min(len(request.sequence()) - request.computed, chunk_left, room)
        if take <= 0:
            if not engine.decoding:  # it can never fit
                engine.chunked = None
                engine.release(request)
                engine.finish(request, "abort")
            return []
        batch.append((request, take))
        if request.computed + take < len(request.sequence()):
            return batch  # the chunk fills the step
        chunk_left, input_left, room = chunk_left - take, input_left - take, room - take
    count = len(engine.running)
    loras = _running_loras(engine, batch)
    passed: list[Request] = []  # of an adapter the batch has no room for: they keep their place
    try:
        while engine.waiting and chunk_left > 0 and input_left > 0:
            request = engine.waiting[0]
            if loras is not None and not _fits(engine, loras, request):
                passed.append(engine.waiting.popleft())
                continue
            sequence = request.sequence()
            if count >= engine.max_running:
                freed = retraction.preempt_for(engine, request, room)
                if not freed:
                    break
                count -= freed
                room = room_for(engine) - sum(take + engine.reserve(r) for r, take in batch)
            if request.prefilled:  # PD decode: the KV arrived whole; no prefill here
                need = len(sequence) + engine.reserve(request)
                if need > room and engine.running:
                    break
                engine.waiting.popleft()
                engine.start(request, len(sequence))
                engine.hold(request, sequence)
                engine.decoding.append(request)
                room, count = room - need, count + 1
                continue
            matched, _ = engine.cache.match(sequence, request.salt)
            matched = min(matched, len(sequence) - 1)  # the last token is always computed
            uncached = len(sequence) - matched
            take = min(uncached, chunk_left)
            if take + engine.reserve(request) > room:
                if engine.running or batch:
                    break  # wait for running requests to free the pool
                if len(sequence) > engine.capacity:
                    engine.waiting.popleft()
                    engine.finish(request, "abort")
                    continue
                take = min(take, max(1, room))
            engine.waiting.popleft()
            engine.start(request, matched)
            if loras is not None:
                loras.add(request.adapter)
            batch.append((request, take))
            room -= take + engine.reserve(request)
            chunk_left, input_left, count = chunk_left - take, input_left - take, count + 1
            if take < uncached:
                engine.chunked = request
                break
    finally:
        engine.waiting.extendleft(reversed(passed))
    return batch


def _running_loras(engine: Engine, batch: list[tuple[Request, int]]) -> set[str | None] | None:
    """The adapters of what runs and what the step has taken (None: LoRA is off)."""
    if engine.max_loras_per_batch is None:
        return None
    return {r.adapter for r in engine.running} | {r.adapter for r, _ in batch}


def _fits(engine: Engine, loras: set[str | None], request: Request) -> bool:
    assert engine.max_loras_per_batch is not None
    return request.adapter in loras or len(loras) < engine.max_loras_per_batch
