"""An answer's stream relayed to the client as its events come, an engine's or a peer region's.

The first attempt to send an event opens the client's stream; an attempt that carries a cut
answer on (agents/gateway/migration.py) writes into the same stream, rewritten to read as its
rest. A failure before the attempt's first event comes back as Retry (the next worker may
answer as if nothing happened); after it, as Cut (the answer is carried on, or ends with an
error event).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from aiohttp import web

from agents.gateway.errors import Preempted
from agents.gateway.flight import Flight, Stream
from agents.gateway.migration import Transcript
from agents.gateway.relay import (
    EVENT_END,
    FIRST_AT,
    Answered,
    Broken,
    ClientGone,
    Cut,
    Outcome,
    Retry,
    StreamMeter,
    Usage,
    server_timing,
    stream_error,
    to_client,
    write_quietly,
)
from agents.gateway.upstream import Answer, UpstreamError

log = logging.getLogger(__name__)


class Track(Protocol):
    """What a relayed answer reports as it goes: to the router for an engine's, to the peer's
    view for a peer region's."""

    @property
    def name(self) -> str: ...  # the worker or peer, for a retry

    def taken(self) -> Outcome | None:
        """What becomes of it if a higher class took its room (None: none did)."""
        ...

    def first_byte(self) -> None: ...
    def progressed(self, events: int) -> None: ...
    def failed(self, broke: bool) -> bool:
        """The answer failed (`broke`: its connection broke off before its first event);
        whether that may be the request's own doing (see Retry)."""
        ...

    def finished(self, usage: Usage, transcript: Transcript) -> None:
        """The answer ended whole; `transcript`: what of it the client got."""
        ...


async def relay_stream(
    flight: Flight,
    upstream: Answer,
    track: Track,
    headers: dict[str, str],
    since: float | None = None,
) -> Outcome:
    """`since`: when a peer region's request came here (the head says how long this gateway
    took, in Server-Timing)."""
    inference = flight.inference
    meter = StreamMeter(inference.native, keep_usage=inference.wants_usage)
    stream = flight.stream
    carried = stream.continuation if stream is not None else None
    first = True
    gone: ClientGone | None = None
    flight.upstream = upstream  # the stall watch fails it if it stops (agents/gateway/carry.py)
    try:
        async for chunk in upstream.chunks():
            data = meter.feed(chunk)
            if not data:
                continue
            if first:
                taken = track.taken()
                if taken is not None:  # its room was taken: the client sees none of it
                    return taken
                first = False
                track.first_byte()
                if stream is None:
                    response = _head(headers, since)
                    stream = flight.stream = Stream(response, Transcript(inference))
                    flight.progress.continuing = True
                    gone = await to_client(response.prepare(flight.http))
                    if gone is not None:
                        break
            assert stream is not None
            if carried is not None:
                data = carried.rewrite(data, inference.native)
            stream.transcript.add(data)
            gone = await to_client(stream.response.write(data), flight.http)
            if gone is not None:
                break
            track.progressed(data.count(EVENT_END))
        rest = meter.rest()
    except UpstreamError as error:
        broke = track.failed(first)
        if first:  # nothing of this answer reached the client: another may give it whole
            return Retry(track.name, f"stream broke: {error}", broke)
        return Cut(track.name, f"stream broke: {error}")
    except Exception as error:  # a fault of ours
        if stream is None:
            raise
        message = stream_error("the gateway failed this stream", "internal_error")
        await write_quietly(stream.response, message)
        return Broken(stream.response, error)
    finally:
        flight.upstream = None
    if gone is not None:  # what the answer held is given back by its holder
        assert stream is not None  # only writes to the client find it gone
        if gone.stalled:  # it held the slot reading nothing: cut, and said so
            flight.client_stalled = True
            log.info("request %s: %s; its stream is cut", flight.id, gone.why,
                     extra={"request_id": flight.id})  # fmt: skip
            if flight.http.transport is not None:
                flight.http.transport.close()
        return Answered(stream.response, meter.usage)
    if stream is None or first:
        track.failed(False)
        return Retry(track.name, "the stream ended before its first event")
    if rest:
        await write_quietly(stream.response, rest, eof=False)
    usage = meter.finish()
    if carried is not None:
        usage = carried.usage(usage)
    track.finished(usage, stream.transcript)
    await write_quietly(stream.response, b"")
    return Answered(stream.response, usage)


def _head(headers: dict[str, str], since: float | None) -> web.StreamResponse:
    response = web.StreamResponse(headers=headers)
    response.content_type = "text/event-stream"
    response.headers["Cache-Control"] = "no-cache"
    response[FIRST_AT] = time.monotonic()
    if since is not None:  # a peer region measures its round trip by it
        response.headers["Server-Timing"] = server_timing(since)
    return response


def preempted() -> Preempted:
    return Preempted(
        "a request of a higher service class took this one's place before its engine started "
        "it; send it again",
        retry_after_s=1,
    )
