"""What the quality guard's detectors cost, in this process: per answer and per chunk, on
answers like the gateway's (bench/quality.py reports it, and so does the overhead
benchmark)."""

from __future__ import annotations

import timeit
from collections.abc import Callable
from typing import Any

import orjson

from agents.engines.sim import tokens
from agents.gateway.answers import from_body
from agents.gateway.requests import Inference
from agents.quality.detectors import Answer, suspect
from agents.quality.peers import PREFIX_BYTES, Book, Source
from bench.harness import MODEL

PROMPTS = (
    "Tell me about the river that runs through the old town.",
    "Write a short note to a colleague about the meeting tomorrow.",
    "Расскажи коротко о реке, которая течёт через старый город.",  # noqa: RUF001
    "请简单介绍一下流经老城的那条河。",
    "Erkläre kurz, wie man ein einfaches Brot backt.",
    "Summarize the plot of a story about a lighthouse keeper.",
)


def detector_cost(number: int = 2000) -> dict[str, Any]:
    """The detectors and the answer's record on answers like the gateway's, per answer and
    per chunk (a streamed answer sends a chunk a token); best of five runs."""
    english = tokens.decode(tokens.output_ids(tokens.encode(PROMPTS[0]), 256, "none"))
    cases: dict[str, tuple[Answer, str, int]] = {
        "32 tokens": (Answer(" ".join(english.split()[:32]), "stop"), PROMPTS[0], 32),
        "256 tokens": (Answer(english, "stop"), PROMPTS[0], 256),
        "256 tokens, not ASCII": (Answer("河流" * 128, "stop"), PROMPTS[3], 256),
        "JSON asked, 64 tokens": (Answer(orjson.dumps({"a": english[:200]}).decode(), "stop",
                                         json_wanted=True), PROMPTS[0], 64),
        "tool call with schema": (Answer("", "tool_calls", [("weather", '{"city": "Oslo"}')],
                                         tools_offered={"weather": {
                                             "type": "object", "required": ["city"],
                                             "properties": {"city": {"type": "string"}}}}),
                                  PROMPTS[0], 16),
        "garbage, 256 tokens": (Answer(tokens.decode(tokens.output_ids(
            tokens.encode(PROMPTS[0]), 256, "garbage")), "length"), PROMPTS[0], 256),
    }  # fmt: skip
    out: dict[str, Any] = {}
    book = Book()
    for name, (answer, prompt, chunks) in cases.items():

        def once(answer: Answer = answer, prompt: str = prompt) -> None:
            key = prompt.encode()  # the source: its tenant and its prompt's prefix, hashed
            book.record("w", suspect(answer, lambda: prompt), "rid",
                        Source("t", hash(key[:PREFIX_BYTES])))  # fmt: skip

        _time(out, name, once, chunks, number)
    # a non-streamed answer is parsed once more to be read (its bytes are on their way)
    asked = [{"role": "user", "content": PROMPTS[0]}]
    inference = Inference("/v1/chat/completions", b"", MODEL, False, b"", False, False, False,
                          messages=asked)  # fmt: skip
    body = orjson.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": english},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 256},
        }
    )

    def whole() -> None:
        flags = suspect(from_body(body, inference) or Answer(""), PROMPTS[0])
        book.record("w", flags, "rid", Source("t", hash(inference.key[:PREFIX_BYTES])))

    _time(out, "256 tokens, a whole body parsed", whole, 256, number)
    out["worst_per_chunk_us"] = max(v["per_chunk_us"] for v in out.values()
                                    if isinstance(v, dict))  # fmt: skip
    return out


def _time(out: dict[str, Any], name: str, once: Callable[[], None], chunks: int,
          number: int) -> None:  # fmt: skip
    us = min(timeit.repeat(once, number=number, repeat=5)) / number * 1e6
    out[name] = {"per_answer_us": round(us, 2), "chunks": chunks,
                 "per_chunk_us": round(us / chunks, 3)}  # fmt: skip
