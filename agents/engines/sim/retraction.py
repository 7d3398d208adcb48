"""What leaves the simulated scheduler's running batch without finishing, as SGLang's does:
requests retracted when a decode step finds the KV pool short (in SGLang's order), and,
with priority scheduling on, running requests retracted for a request of a priority far
enough above theirs that finds every slot taken. A retracted request waits again; it is not lost."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agents.engines.sim.request import Request

if TYPE_CHECKING:
    from agents.engines.sim.engine import Engine

INIT_NEW_TOKEN_RATIO = 0.7  # SGLang's defaults (schedule_conservativeness 1.0)


def make_room(engine: Engine, tokens: int) -> None:
    """Room for the decode batch's next tokens: evict unused prefixes, then retract requests
    (`kept_before`'s order) until the rest fit."""
    short = engine.held_tokens + tokens - engine.capacity
    if short > 0:
        engine.cache.evict(short)
    while engine.decoding and engine.held_tokens + len(engine.decoding) > engine.capacity:
        victim = min(engine.decoding, key=lambda r: kept_before(engine, r))
        engine.decoding.remove(victim)
        retract(engine, victim)
        engine.retracted_total += 1
        engine.waiting.appendleft(victim)
        engine.new_token_ratio = INIT_NEW_TOKEN_RATIO
        engine.cache.evict(engine.held_tokens + len(engine.decoding) - engine.capacity)


def kept_before(engine: Engine, request: Request) -> tuple[int, ...]:
    """SGLang's order of retraction for lack of room (`_get_decode_retraction_order`): the
    smallest key goes first. By default (`--retraction-policy length`) the shortest answer
    so far, then the longest prompt; with `priority`, the lowest priority before that."""
    length = (request.generated, -len(request.prompt))
    policy = engine.priority
    if policy is not None and policy.retract_by_priority:
        return (-policy.rank(request.priority or 0), *length)
    return length


def preempt_for(engine: Engine, request: Request, room: int) -> int:
    """With every slot taken: retract decoding requests of a priority more than the
    threshold below `request`'s, the lowest and newest first, if together they free what it
    needs (its sequence and decode reserve, less `room`). How many were retracted."""
    policy = engine.priority
    if policy is None or not policy.preempt or request.priority is None:
        return 0
    need = len(request.sequence()) + engine.reserve(request) - room
    victims = policy.victims(request, engine.decoding, need, engine.reserve)
    for victim in victims:
        engine.decoding.remove(victim)
        retract(engine, victim)
        victim.queued = engine.now()  # SGLang queues it again, as a new arrival
        engine.waiting.append(victim)
    engine.preempted_total += len(victims)
    return len(victims)


def retract(engine: Engine, victim: Request) -> None:
    """Out of the running batch, back to wait: what it computed stays in the cache while room
    lasts, as SGLang keeps it."""
    engine.release(victim)
    engine.cache.insert(victim.sequence(), victim.salt)
    victim.computed = 0
