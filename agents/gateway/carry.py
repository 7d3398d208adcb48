"""An answer that has started is finished: a stream whose worker fails mid-answer (its
connection reset, its engine killed, no event for STALL_S) is carried on by another worker,
in the region when one is left, else in a peer that the fallback rule and residency allow.

The gateway's serve loop (agents/gateway/service.py) picks the next worker as for any retry;
this module decides whether the answer can go on, builds what the next worker is sent
(agents/gateway/migration.py), notes where it went and why, and ends a stream that cannot go
on: with `data: [DONE]` when its last content had already gone out, else with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable

from agents.gateway.flight import MAX_MIGRATIONS, Flight
from agents.gateway.migration import continuation
from agents.gateway.relay import Cut, Usage, stream_error, write_quietly
from agents.gateway.upstream import UpstreamError

log = logging.getLogger(__name__)
EVACUATE_S = 10.0  # the longest an engine's stop waits for its streams to be carried on
STALL_S = 30.0  # a started stream with no event this long is taken to have failed
DONE = b"data: [DONE]\n\n"


class Carrier:
    def __init__(
        self, max_migrations: int = MAX_MIGRATIONS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_migrations = max_migrations
        self.clock = clock
        self.streams: set[Flight] = set()  # streamed answers under way, for the watch
        self._seen: dict[Flight, tuple[int, float]] = {}  # bytes sent, and since when
        # (model, where it went on: "region", "peer" or "ended", why it was cut)
        self.migrations: Counter[tuple[str, str, str]] = Counter()

    def cut(self, flight: Flight, cut: Cut) -> str | None:
        """The stream broke after part of it reached the client: its continuation is made
        ready for the next worker. Returns why the stream is to end instead, when it cannot be
        continued or was carried on max_migrations times already."""
        stream = flight.stream
        assert stream is not None
        attempt = flight.attempts[-1]
        attempt.ended = cut.why
        flight.tried.add(cut.by)
        stream.cuts += 1
        log.warning(
            "request %s: the answer broke off at %s (%s)", flight.id, attempt.by, cut.why,
            extra={"request_id": flight.id},
        )  # fmt: skip
        stream.cut = (attempt.by, cut.why)
        if stream.cuts > self.max_migrations:
            return f"it was carried on {self.max_migrations} times already"
        carried = continuation(flight.inference, flight.body, stream.transcript)
        if carried is None:
            return "it cannot be continued (tool calls or reasoning came, or nothing was left)"
        stream.continuation = carried
        flight.failures = 0  # the continuation has its own tries
        flight.since = self.clock()  # time lost to a failed worker is not the load's
        return None

    def carried(self, flight: Flight, by: str) -> None:
        """`by` (a worker, or peer:<region>) takes a cut answer on."""
        stream = flight.stream
        if stream is None or stream.cut is None:
            return
        why = _why(stream.cut[1])
        note = stream.carried_to(by)
        self.migrations[flight.model.name, "peer" if by.startswith("peer:") else "region", why] += 1
        flight.served.migrated = "; ".join(stream.migrations)
        log.info("request %s: carried on, %s", flight.id, note, extra={"request_id": flight.id})

    async def end(self, flight: Flight, why: str) -> None:
        """A stream that cannot go on ends: whole, if its last content went out already, else
        with an error event that says where it broke off and why it could not go on."""
        stream = flight.stream
        assert stream is not None
        if stream.cut is not None:
            by, cause = stream.cut
            self.migrations[flight.model.name, "ended", _why(cause)] += 1
            stream.cut = None
            why = f"the answer broke off at {by} ({cause}) and could not go on: {why}"
        finished = stream.transcript.finished
        await write_quietly(stream.response, DONE if finished else stream_error(why))
        flight.answer = stream.response, Usage()

    def watch(self) -> None:
        """Streams that sent nothing for STALL_S have their worker's answer failed, which
        cuts them (and closes the connection, which stops the engine's work on it)."""
        now = self.clock()
        seen = {}
        for flight in self.streams:
            stream, answer = flight.stream, flight.upstream
            if stream is None or answer is None:
                continue
            sent = stream.transcript.sent
            before, since = self._seen.get(flight, (-1, now))
            if sent != before:
                since = now
            elif now - since >= STALL_S:
                answer.fail(UpstreamError(f"no event for {STALL_S:g} s"))
                continue
            seen[flight] = (sent, since)
        self._seen = seen

    async def evacuate(
        self, worker: str, inflight: Callable[[], int], within_s: float = EVACUATE_S
    ) -> None:
        """The streams a worker relays, cut, so that they are carried on elsewhere: its engine
        is about to stop (its drain deadline passed). Waits, within_s at most, until the worker
        holds no request of this gateway's."""
        for flight in self.streams:
            answer = flight.upstream
            if answer is not None and flight.attempts and flight.attempts[-1].by == worker:
                answer.fail(UpstreamError("the engine is stopping: its drain deadline passed"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within_s):
                while inflight():  # noqa: ASYNC110 - tickets end in other tasks, no event
                    await asyncio.sleep(0.05)

    async def watch_forever(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.watch()


def _why(text: str) -> str:
    """A cut's cause, as the metric names it."""
    if "no event" in text:
        return "stalled"
    return "drained" if "drain deadline" in text else "broke"
