"""Whole answers gathered from a stream (agents/gateway/gather.py): which requests may be, how
the events so far carry the answer on, and the whole answer made of them. The gateway over a
real engine, giving way and carried on, is in test_classes.py."""

from __future__ import annotations

from typing import Any

import orjson

from agents.gateway.gather import Gather
from agents.gateway.requests import Inference, plain

CHAT = "/v1/chat/completions"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
ASKED: dict[str, Any] = {"model": "m", "messages": MESSAGES, "max_tokens": 10}


def test_only_requests_a_continuation_reads_alike_are_gathered() -> None:
    assert plain(CHAT, ASKED)
    assert plain(CHAT, ASKED | {"temperature": 0.7, "stop": ["\n"], "n": 1, "stream": False})
    assert plain("/v1/completions", {"model": "m", "prompt": "once", "max_tokens": 3})
    assert plain("/v1/completions", {"model": "m", "prompt": ["once"]})
    unlikes: list[dict[str, Any]] = [{"stream": True}, {"n": 2}, {"logprobs": True}, {"seed": 1},
                   {"tools": []}, {"response_format": {"type": "json_object"}},
                   {"frequency_penalty": 0.5}, {"regex": "a+"}]  # fmt: skip
    for unlike in unlikes:
        assert not plain(CHAT, ASKED | unlike), unlike
    assert not plain("/v1/completions", {"model": "m", "prompt": ["a", "b"]})  # a batch
    assert not plain("/v1/completions", {"model": "m", "prompt": [1, 2]})  # token ids
    assert not plain("/generate", {"text": "once"})


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def _chunk(text: str | None, made: int, finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {"content": text, "reasoning_content": None}
    return _event({"id": "a1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                "finish_reason": finish, "matched_stop": None}],
                   "usage": {"prompt_tokens": 5, "completion_tokens": made,
                             "total_tokens": 5 + made}})  # fmt: skip


def test_an_answer_that_gave_way_is_carried_on_and_made_whole() -> None:
    body = orjson.dumps(ASKED)
    gather = Gather(Inference(CHAT, body, "m", False, b"hi", False, False, False,
                              messages=MESSAGES))  # fmt: skip
    first = orjson.loads(gather.next_body())
    assert first["stream"] is True
    assert first["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    # the first engine made 4 tokens in 2 events (a stream interval of 2), then gave way
    gather.transcript.add(_chunk("Hello", 2) + _chunk(" there", 4))
    again = orjson.loads(gather.next_body())
    assert again["max_tokens"] == 6  # what is left: counted by the usage, not the events
    assert again["messages"][-1] == {"role": "assistant", "content": "Hello there"}
    assert again["continue_final_message"] is True
    carried = gather.continuation
    assert carried is not None
    # the next engine's events read as the rest of the same answer
    rest = _chunk(" friend", 3, "length") + _event({
        "id": "b2", "object": "chat.completion.chunk", "created": 9, "model": "m",
        "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6,
                                 "total_tokens": 15}})  # fmt: skip
    gather.transcript.add(carried.rewrite(rest, False))
    whole = orjson.loads(gather.answer())
    assert whole["id"] == "a1"
    assert whole["object"] == "chat.completion"
    assert whole["choices"] == [{
        "index": 0, "message": {"role": "assistant", "content": "Hello there friend",
                                "reasoning_content": None},
        "logprobs": None, "finish_reason": "length", "matched_stop": None}]  # fmt: skip
    assert whole["usage"] == {"prompt_tokens": 5, "completion_tokens": 10, "total_tokens": 15}
