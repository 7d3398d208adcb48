"""An answer that has started is finished: a stream whose worker fails mid-answer (its
connection reset, its engine killed, no event for STALL_S) is carried on by another worker,
in the region when one is left, else in a peer that the fallback rule and residency allow.

The router's plan picks the next worker as for any retry, or ends the stream once it was
carried on too often (agents/router/plan.py); this module builds what the next worker is sent
(agents/gateway/migration.py), notes where it went and why, and ends a stream that cannot go
on: with `data: [DONE]` when its last content had already gone out, else with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from agents.books import Books
from agents.gateway.flight import Flight
from agents.gateway.migration import continuation
from agents.gateway.relay import Cut, Usage, stream_error, write_quietly
from agents.gateway.upstream import UpstreamError

log = logging.getLogger(__name__)
EVACUATE_S = 10.0  # the longest an engine's stop waits for its streams to be carried on
STALL_S = 30.0  # a started stream with no event this long is taken to have failed
DONE = b"data: [DONE]\n\n"


class Carrier:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, books: Books | None = None
    ) -> None:
        self.clock = clock
        self.books = books if books is not None else Books()
        self.streams: set[Flight] = set()  # streamed answers under way, for the watch
        self._seen: dict[Flight, tuple[int, float]] = {}  # bytes sent, and since when

    def cut(self, flight: Flight, cut: Cut) -> str | None:
        """The stream broke after part of it reached the client: its continuation is made
        ready for the next worker (whether there is one is the plan's to say). Returns why the
        stream is to end instead, when it cannot be continued."""
        stream, progress = flight.stream, flight.progress
        assert stream is not None
        by = progress.attempts[-1].by
        progress.cut(cut.by, cut.why, self.clock())
        log.warning(
            "request %s: the answer broke off at %s (%s)", flight.id, by, cut.why,
            extra={"request_id": flight.id},
        )  # fmt: skip
        stream.cut = (by, cut.why)
        carried = continuation(flight.inference, flight.body, stream.transcript)
        if carried is None:
            return "it cannot be continued (tool calls or reasoning came, or nothing was left)"
        stream.continuation = carried
        if stream.began is None:
            stream.began = by, carried.shift
        return None

    def carried(self, flight: Flight, by: str) -> None:
        """`by` (a worker, or peer:<region>) takes a cut answer on."""
        stream = flight.stream
        if stream is None or stream.cut is None:
            return
        why = _why(stream.cut[1])
        note = stream.carried_to(by)
        self.books.migrations[
            flight.model, "peer" if by.startswith("peer:") else "region", why
        ] += 1
        log.info("request %s: carried on, %s", flight.id, note, extra={"request_id": flight.id})

    async def end(self, flight: Flight, why: str) -> None:
        """A stream that cannot go on ends: whole, if its last content went out already, else
        with an error event that says where it broke off and why it could not go on."""
        stream = flight.stream
        assert stream is not None
        if stream.cut is not None:
            by, cause = stream.cut
            self.books.migrations[flight.model, "ended", _why(cause)] += 1
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
            attempts = flight.progress.attempts
            if answer is not None and attempts and attempts[-1].by == worker:
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
