"""What the router predicts of a worker: its KV pool's room, the wait of what its engine
holds back, when its running answers finish, the prefill ahead of a new request. Pure
functions of the worker's view (agents/router/view.py) and its engine's polled load: they
read, never write; the view changes only through its own methods."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from meridian_pb.fleet.v1.params import CostParams

from agents.router.view import OVERDUE_MARGIN, RESERVE_RATIO, Flight, WorkerView
from agents.workers.table import EngineLoad

if TYPE_CHECKING:  # what admission asks `fits` about (they import this module)
    from agents.config import RouteConfig
    from agents.router.decision import Decision
    from agents.router.policies import RouteRequest


def _ran(view: WorkerView, flight: Flight, now: float, step: float) -> float:
    """Tokens a started answer has run: counted from its stream's events, or by time."""
    assert flight.first_at is not None
    if flight.events and view.tokens_per_event > 0:
        return flight.events * view.tokens_per_event
    return (now - flight.first_at) / step


def head_age(view: WorkerView, now: float) -> float:
    """How long the oldest request sent here that has not started has waited: the delay
    the engine's queue puts on a request now (as CoDel reads a queue by its packets'
    sojourn), whatever holds it back (prefill ahead, KV room, retractions). It rises at
    once when an engine stalls and falls to nothing when its queue from here empties."""
    if view._unstarted:
        for flight in view._flights.values():
            if flight.first_at is None:
                return max(0.0, now - flight.sent_at)
    return 0.0


def finish_s(view: WorkerView, share: float, now: float, batch: float = 0.0) -> float:
    """Seconds until `share` of the engine's running batch has finished. The requests
    this gateway has running there say when theirs end (each its expected answer at the
    decode step, less what it has run): a batch that started together finishes together,
    which an average over the batch does not show. Past the batch, or with none of ours
    running, answers end at the batch's turnover (Little's law)."""
    if share <= 0:
        return 0.0
    step = _running_step(view, now, batch)
    turnover_s = view.mean_output * step
    left = sorted(
        max(0.0, (f.answer - _ran(view, f, now, step)) * step)
        for f in view._flights.values()
        if f.first_at is not None
    )
    if not left:
        return share * turnover_s
    if share > 1:
        return left[-1] + (share - 1) * turnover_s
    return left[max(0, math.ceil(share * len(left)) - 1)]


def room_wait(
    view: WorkerView,
    need: float,
    load: EngineLoad,
    now: float,
    answer: float | None = None,
    reserve_ratio: float = RESERVE_RATIO,
    kept: float = 0.0,
) -> float:
    """Seconds until the engine's KV pool has room for `need` more tokens after what is
    queued there: SGLang admits a request only with room for its uncached prompt and a
    share of each running answer's rest and of its own (`answer` tokens, by default the
    mean here). At a `reserve_ratio` of 1, room for every answer to finish, so that
    nothing started is retracted (when room runs out an engine retracts its newest
    request, which then waits for room again, often before its first chunk). When the
    pool is short, a request waits for running ones to end and free theirs (`_room_at`).
    `kept`: the share of the pool it may not take (higher service classes' reserves).
    Without the pool's size, waiting requests are taken to be held back for room."""
    if load.running <= 0 and view.sent_since_poll <= 0:
        return 0.0
    if load.max_total_tokens <= 0:
        return held_wait(view, load, now)  # one finished request each
    answer = view.mean_output if answer is None else answer
    queued = (
        load.pending_tokens
        + view.tokens_since_poll
        + (load.waiting + view.sent_since_poll) * view.mean_output * reserve_ratio
    )
    free = load.max_total_tokens * (1.0 - kept) - load.used_tokens - queued - need
    reserve = (to_come(view, load, now) + answer) * reserve_ratio
    if free >= reserve:
        return 0.0
    at = _room_at(view, load, now, free, answer, reserve_ratio)
    if at is not None:
        return at
    # the requests queued for room go first (when prefixes are evicted for room, tokens
    # count short), then this one as room for it frees; a finishing share of the batch
    # frees that share of what it holds
    used = max(load.used_tokens, 1)
    own = need + answer * reserve_ratio
    short = reserve - free
    share = max(short / used, _held_share(view, load) + own / used)
    return finish_s(view, share, now, load.running)


def _room_at(
    view: WorkerView, load: EngineLoad, now: float, free: float, answer: float, ratio: float
) -> float | None:
    """Seconds until the pool, short of room now by what `free` lacks, has it: the
    running answers go on a token a step (each taking pool, and needing that much less
    reserved), and each frees, as it ends, what it holds (its uncached prompt and its
    answer). The requests this gateway has running here stand for the engine's whole
    batch (others' are taken to be like them). None: none of ours run here."""
    step = _running_step(view, now, load.running)
    rest = sorted(
        (max(0.0, f.answer - _ran(view, f, now, step)), f.tokens + f.answer)
        for f in view._flights.values()
        if f.first_at is not None
    )
    if not rest:
        return None
    scale = max(1.0, load.running / len(rest))
    to_come = sum(r for r, _ in rest)
    # what they hold now, shared prefixes once: an end frees its share of the pool used
    held = sum(holds for _, holds in rest) - to_come
    share = min(1.0, load.used_tokens / scale / held) if held > 0 else 1.0
    growing, freed = len(rest), 0.0
    for r, holds in rest:  # r steps from now, just after this one ends
        growing -= 1
        freed += (holds - r) * share  # what it held now; it grew its rest first
        to_come -= r
        taken = scale * (growing * r - freed)
        reserve = ratio * (scale * (to_come - growing * r) + answer)
        if free - taken >= reserve:
            return r * step
    return rest[-1][0] * step


def step_at(view: WorkerView, batch: float) -> float:
    """The time per token of an answer here with `batch` requests running: as answers
    here have lately run (their mean gaps, measured, not a gauge of the moment), moved
    along the engine's step line from the batch they ran in to this one."""
    slope = view.line.slope() or 0.0
    slope = min(slope, view.decode_step_s / max(view.decode_batch, 1.0))
    return max(view.decode_step_s / 4, view.decode_step_s + slope * (batch - view.decode_batch))


def to_come(view: WorkerView, load: EngineLoad, now: float) -> float:
    """Answer tokens the engine's running requests have still to generate: of those this
    gateway has running there, their expected answers less what they have run (counted
    from their streams' events, else by time at the step; a batch that started together
    has nearly all of its answers to come); of others, half an answer each."""
    step = _running_step(view, now, load.running)
    if view.tokens_per_event > 0:  # the streams' events count; the others run by time
        timed = view._running - view._counted
        run = view._events * view.tokens_per_event
        run += (timed * now - (view._firsts - view._counted_firsts)) / step
    else:
        run = (view._running * now - view._firsts) / step
    left = max(0.0, view._answers - run)
    others = max(0, load.running - view._running)
    # ours that the engine has started and that have sent no byte yet (sent before the
    # poll, and not among those it holds back): their whole answers are to come
    mine = min(others, max(0, view._unstarted - view.sent_since_poll - load.waiting))
    return left + mine * view.mean_output + (others - mine) * view.mean_output / 2


def _answer_step(view: WorkerView) -> float:
    return max(view.decode_step_s, view.batch_step_s)


def _running_step(view: WorkerView, now: float, batch: float) -> float:
    """The time per token of the answers running here: as learned, and at least as the
    engine's step at this batch (the step line); and when one runs past its expected end
    (it has not run all of its tokens), as that one shows, with a margin: an answer taken
    to have ended while it runs would be taken to have freed its room, and the requests
    waiting for that room taken to start now. The oldest sent stands for the longest
    running."""
    step = (
        max(
            _answer_step(
                view,
            ),
            step_at(view, batch),
        )
        if batch > 0
        else _answer_step(
            view,
        )
    )
    if not view._running:
        return step
    # the oldest sent of those started (flights are kept in the order they were sent)
    oldest = next(f for f in view._flights.values() if f.first_at is not None)
    shown = (now - (oldest.first_at or now)) / max(oldest.answer, 1.0)
    return step if shown <= step else OVERDUE_MARGIN * shown


def held_wait(view: WorkerView, load: EngineLoad, now: float) -> float:
    """Seconds the requests an engine holds back (as polled, and sent since) take to
    start when each waits for a running one to finish and free its room. An engine that
    reserves more room than the pool arithmetic shows, or retracts, holds them so."""
    return finish_s(view, _held_share(view, load), now, load.running)


def slot_wait(view: WorkerView, load: EngineLoad, now: float) -> float:
    """Seconds until the engine has a slot for one more request (it runs
    `max_running_requests` at once, as /v1/loads says): those waiting there, and this one,
    each take the slot of a running one as it finishes. 0 while slots are free."""
    if load.max_running <= 0:
        return 0.0
    there = max(load.running + load.waiting + view.sent_since_poll, view.inflight)
    short = there + 1 - load.max_running
    if short <= 0:
        return 0.0
    running = min(there, load.max_running)
    return finish_s(view, short / running, now, running)


def _held_share(view: WorkerView, load: EngineLoad) -> float:
    if load.waiting <= 0 or load.running <= 0:
        return 0.0
    return (load.waiting + view.sent_since_poll) / load.running


def queued_work(view: WorkerView, pending_tokens: int) -> float:
    """Prefill tokens ahead of a new request here: the engine's waiting uncached prompt
    tokens (as it estimates them: `num_waiting_uncached_tokens`), plus what was sent
    since the poll; at least what this gateway knows it has queued there."""
    engine = pending_tokens + view.tokens_since_poll
    return max(engine, view.queued_tokens)


def fits(
    decision: Decision,
    route: RouteConfig,
    request: RouteRequest,
    since: float,
    now: float,
    ratio: float = 1.0,
    kept: float = 0.0,
    slack: float | None = None,
    slots: bool = False,
    room_kept: float | None = None,
) -> tuple[bool, float | None]:
    """Whether the best worker can start the request within the SLO, and the wait for its
    first byte predicted there (None where admission predicts none: the policy's stands).
    `ratio`: of each running answer's rest, the room kept for it (1: every answer there
    finishes; RESERVE_RATIO: as the engine itself admits). `kept`: the share of the
    worker's KV pool, and of the requests its engine runs at once, it may not take (higher
    classes' reserves). `slack`: a class admitted on slack is admitted when its first byte
    is predicted that soon, its wait not counted. `slots`: an engine whose slots are all
    taken makes it wait for one (see `slot_wait`); asked only where lower classes' requests
    run that it may take the room of, since elsewhere the engine's own queue serves as
    before (and escalation reads its queue). `room_kept`: of the KV pool, the share it may
    not take, where that is more than `kept` (what higher classes are likely to want back:
    admission.py)."""
    slo = route.slo_ttft_s
    predicted = decision.best_ttft_s
    if slo is None or predicted is None:
        return True, None
    best = decision.ranked[0]
    if best.view.inflight == 0 and best.load == 0:
        return True, None  # an idle worker: nothing to wait for, whatever the estimate says
    # a request there waits at least as long as the oldest one sent there has, unstarted,
    # and as the requests the engine holds back take to start; and it is admitted only with
    # room for every answer there to finish (when room runs out an engine retracts its
    # newest request, which then waits for room again, often before its first chunk)
    view, load, params = best.view, best.entry.load, route.params
    if kept > 0 and load.max_running > 0:  # a higher class's share of the engine's slots
        busy = load.running + load.waiting + view.sent_since_poll
        if busy + 1 > load.max_running * (1.0 - kept):
            return False, predicted
    uncached = max(0, request.prompt_tokens - best.matched_tokens)
    answer = view.answer(request.max_new)
    room_kept = kept if room_kept is None else room_kept
    held, room = (
        max(held_wait(view, load, now), slot_wait(view, load, now) if slots else 0.0),
        room_wait(view, uncached, load, now, answer, ratio, room_kept),
    )
    # what the model misses (a step it has not learned, answers that run long) it misses
    # again: the prediction is scaled by how late first bytes have lately come here
    wait = max(predicted, head_age(view, now), held, room)
    if (
        (held > 0 or room > 0 or load.waiting > 0)
        and isinstance(params, CostParams)
        and view.unstarted >= params.max_unstarted
    ):
        # an engine that holds requests back for room (its queue says so, or the model
        # does): what it cannot start at once waits here, where it can be shed (one that
        # has room starts a burst together, in a batch)
        return False, wait
    if slack is not None:
        return wait * view.bias <= slack, wait
    return now - since + wait * view.bias <= slo, wait
