"""Whole answers that give way without losing their work.

A request of a class that gives its room to a higher class (`requeue`: by default `flex` and
`batch`) whose client asked for a whole answer is asked of its engine as a stream, with
`stream_options.continuous_usage_stats` (every event says how many tokens the answer has so
far), and its events are gathered here. The client gets one whole answer at the end, made from
them. When it gives way (agents/router/classes.py), it is aborted on its engine, as before,
but what its engine made so far is kept: once admitted again, it is carried on from there,
as a migrated stream is (agents/gateway/migration.py: the answer so far as an open last
message, its `max_tokens` less what was made). An engine that breaks off mid-answer is
likewise carried on by the next. An answer that cannot be carried on (reasoning streamed, or
one that ended as aborted) starts over, as every whole answer did before.

Only plain requests are gathered: chat, or a completion of one text prompt, that sets nothing
but the model, its prompt, the answer's length, temperature, top_p, top_k, min_p, stop, n=1,
service_tier and user. Anything else (tools, logprobs, response formats, seeds, penalties,
min_tokens, SGLang's own fields) may read differently once carried on, so it is sent as the
client asked and, when it gives way, loses its work as before.

What the client gets is the engine's answer as one: the first event's `id`, `created` and
`model`, the text (and any reasoning), the finish reason and stop matched of the last, and the
usage of the whole answer. Fields only a whole answer has (SGLang's `metadata`) are not there.
Gathering re-encodes the request once and reads every event; it is for the classes that wait
anyway, never for interactive traffic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from agents.gateway.migration import Continuation, Transcript, continuation
from agents.gateway.relay import (
    EVENT_END,
    Answered,
    Outcome,
    Retry,
    StreamMeter,
    server_timing,
)
from agents.gateway.upstream import Answer, UpstreamError

if TYPE_CHECKING:
    from agents.gateway.flight import Flight
    from agents.gateway.requests import Inference
    from agents.gateway.streams import Track

STREAMED = {"stream": True, "stream_options": {"include_usage": True,
                                               "continuous_usage_stats": True}}  # fmt: skip
JSON_TYPE = "application/json"


class Gather:
    """A whole answer's events so far, over however many engines it took."""

    __slots__ = ("body", "continuation", "inference", "transcript")

    def __init__(self, inference: Inference) -> None:
        doc = orjson.loads(inference.body)
        self.body = orjson.dumps(doc | STREAMED)  # the client's, asked as a stream
        self.inference = inference
        self.transcript = Transcript(inference)
        self.continuation: Continuation | None = None

    def next_body(self) -> bytes:
        """What the next engine is sent: the request, or its continuation from the answer
        so far; the request again when the answer cannot be carried on."""
        transcript = self.transcript
        transcript.fold()
        if transcript.sent:
            self.continuation = continuation(self.inference, self.body, transcript)
            if self.continuation is not None:
                return self.continuation.body
            self.transcript = Transcript(self.inference)  # it starts over
        self.continuation = None
        return self.body

    def answer(self) -> bytes:
        """The whole answer, made of the events gathered."""
        transcript = self.transcript
        text = transcript.text()
        head = transcript.head or {}
        choice: dict[str, Any] = {"index": 0}
        if transcript.kind == "chat":
            reasoning = "".join(transcript.reasoning) or None
            choice["message"] = {"role": "assistant", "content": text,
                                 "reasoning_content": reasoning}  # fmt: skip
            kind = "chat.completion"
        else:
            choice["text"] = text
            kind = "text_completion"
        choice.update(logprobs=None, finish_reason=transcript.finish_reason,
                      matched_stop=transcript.matched_stop)  # fmt: skip
        doc = {"id": head.get("id"), "object": kind, "created": head.get("created"),
               "model": head.get("model"), "choices": [choice],
               "usage": transcript.usage}  # fmt: skip
        return orjson.dumps(doc)


async def gather_stream(
    flight: Flight, gather: Gather, upstream: Answer, track: Track, headers: dict[str, str],
    since: float | None,
) -> Outcome:  # fmt: skip
    """An engine's stream of a whole answer, gathered: the answer once it ends; Retry when
    the engine broke off or ended it unfinished (the next carries it on); or what it
    becomes when a higher class took its room (it waits again, keeping what came)."""
    meter = StreamMeter(False, keep_usage=True)
    carried, transcript = gather.continuation, gather.transcript
    first = True
    try:
        async for chunk in upstream.chunks():
            data = meter.feed(chunk)
            if not data:
                continue
            taken = track.taken()
            if taken is not None:  # its room went to a higher class: it keeps what came
                return taken
            if first:
                first = False
                track.first_byte()
            if carried is not None:
                data = carried.rewrite(data, False)
            transcript.add(data)
            track.progressed(data.count(EVENT_END))
    except UpstreamError as error:
        return Retry(track.name, f"stream broke: {error}", track.failed(first))
    taken = track.taken()
    if taken is not None:
        return taken
    transcript.fold()
    if first or not transcript.finished or transcript.finish_reason == "abort":
        track.failed(False)
        return Retry(track.name, "the stream ended before its answer did")
    usage = meter.finish()
    if carried is not None:
        usage = carried.usage(usage)
    track.finished(usage, transcript)
    out = dict(headers)
    out["Content-Type"] = JSON_TYPE
    if since is not None:
        out["Server-Timing"] = server_timing(since)
    return Answered(web.Response(body=gather.answer(), headers=out), usage)
