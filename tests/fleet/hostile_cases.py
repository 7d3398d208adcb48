"""Hostile requests, made from a seed: headers no client library would send, bodies with every
field of the wrong type or out of range, and transports that lie, stall, cut off or leave at
every stage. Each case says what it sent and what a correct gateway may answer; the driver
sends cases against a live region for a time budget.

What every answer must be: none at all where the connection was cut or is closed for a bad
head, else an OpenAI-shaped error (a JSON body with `error.code`), or a served answer (200).
Never a 5xx, and never a plain-text body. After a run nothing may be held anywhere."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from tests.fleet.hostile import Raw, raw
from tests.kits.fleet import LLAMA

PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")
SURROGATE = "LONE-SURROGATE"  # sent as a lone surrogate's escape, or as bytes not UTF-8
WEIRD_VALUES: list[object] = [
    None, True, False, 0, -1, 1, 2**31, -(2**63), 2**64, 10**30, 1e308, -1e308, 5e-324, 0.5,
    "", "x" * 10_000, "\u0000", SURROGATE, "\u202e", "1", "true", [], [None], [[[]]], {},
    {"a": {"b": {"c": [1, {"d": None}]}}}, ["a"] * 100, list(range(300)),
]  # fmt: skip
FIELDS = {
    "/v1/chat/completions": ["model", "messages", "max_tokens", "max_completion_tokens",
                             "temperature", "top_p", "n", "stream", "stream_options", "stop",
                             "logprobs", "top_logprobs", "tools", "tool_choice", "seed",
                             "presence_penalty", "frequency_penalty", "user", "response_format"],
    "/v1/completions": ["model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream",
                        "logprobs", "echo", "best_of", "suffix", "stop", "seed"],
    "/generate": ["model", "text", "input_ids", "sampling_params", "stream", "return_logprob"],
}  # fmt: skip


@dataclass
class Case:
    kind: str
    parts: list[bytes]
    pause_s: float = 0.0
    cut_after_s: float | None = None  # the client leaves this long after sending
    statuses: frozenset[int] | None = None  # the answers allowed, when narrower than any

    def describe(self) -> str:
        sent = b"".join(self.parts)
        return f"{self.kind}: {sent[:300]!r}{'...' if len(sent) > 300 else ''}"


@dataclass
class Outcome:
    cases: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int | None] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)


def valid_body(path: str, rng: random.Random, stream: bool = False) -> dict[str, object]:
    if path == "/v1/chat/completions":
        body: dict[str, object] = {
            "model": LLAMA,
            "messages": [{"role": "user", "content": f"hi {rng.random()}"}],
        }
    elif path == "/v1/completions":
        body = {"model": LLAMA, "prompt": f"once {rng.random()}"}
    else:
        body = {"model": LLAMA, "text": f"native {rng.random()}",
                "sampling_params": {"max_new_tokens": 4}}  # fmt: skip
    if path != "/generate":
        body["max_tokens"] = 4
    if stream:
        body["stream"] = True
    return body


def http_request(path: str, body: bytes, headers: list[bytes], length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    head = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: gateway",
            b"Content-Type: application/json", b"Content-Length: %d" % size, *headers]  # fmt: skip
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class Cases:
    """Hostile cases from a seed."""

    def __init__(self, seed: int, auth: bytes) -> None:
        self.rng = random.Random(seed)
        self.auth = auth
        self.makers: list[Callable[[], Case]] = [
            self.hostile_header, self.hostile_body, self.unknown_fields, self.truncated_body,
            self.lying_length, self.short_length, self.cut_off, self.slow_but_whole,
            self.bad_framing,
        ]  # fmt: skip

    def next(self) -> Case:
        return self.rng.choice(self.makers)()

    def _path(self) -> str:
        return self.rng.choice(PATHS)

    def _body(self, path: str, stream: bool = False) -> bytes:
        return orjson.dumps(valid_body(path, self.rng, stream))

    def hostile_header(self) -> Case:
        r = self.rng
        value = r.choice([
            bytes(r.randrange(0x80, 0x100) for _ in range(r.randrange(1, 40))),  # not UTF-8
            bytes(r.choice([0, 1, 7, 8, 11, 12, 27, 127]) for _ in range(r.randrange(1, 8))),
            b"x" * r.choice([129, 1000, 8000, 9000, 70_000]),  # long, and past the limits
            b"00-" + b"f" * 32 + b"-" + b"0" * 16 + b"-01",  # a traceparent of zero ids
            b"zz-" + bytes(r.randrange(0x21, 0x7F) for _ in range(55)),  # a garbled one
            b"\xc3\x28", b" ", b"",
        ])  # fmt: skip
        name = r.choice([b"X-Request-ID", b"traceparent", b"tracestate", b"Authorization",
                         b"x-meridian-debug", b"x-meridian-assertion", b"x-meridian-hop",
                         b"Content-Type", b"X-Custom"])  # fmt: skip
        headers = [self.auth, name + b": " + value]
        if r.random() < 0.3:  # the same header twice, the second differing
            headers.append(name + b": " + value[::-1])
        if name == b"Authorization":
            headers = headers[1:]
        path = self._path()
        return Case("header " + name.decode(), [http_request(path, self._body(path), headers)])

    def hostile_body(self) -> Case:
        r = self.rng
        path = self._path()
        body = valid_body(path, r, stream=r.random() < 0.3)
        for _ in range(r.randrange(1, 4)):
            name = r.choice(FIELDS[path])
            body[name] = r.choice(WEIRD_VALUES)
        data = (
            json.dumps(body)
            .encode()
            .replace(  # big ints, which orjson refuses
                SURROGATE.encode(), r.choice([b"\\ud800", b"\xed\xa0\x80", b"\xff\xfe"])
            )
        )
        return Case("body " + path, [http_request(path, data, [self.auth])])

    def unknown_fields(self) -> Case:
        r = self.rng
        path = self._path()
        body = valid_body(path, r)
        for i in range(r.randrange(1, 50)):
            body[f"x_{i}_{r.randrange(10**6)}"] = r.choice(WEIRD_VALUES)
        if path == "/v1/chat/completions" and r.random() < 0.5:
            body["messages"] = [{"role": "user", "content": "hi", "weird": r.choice(WEIRD_VALUES)}]
        data = json.dumps(body).encode()
        return Case("unknown fields", [http_request(path, data, [self.auth])])

    def truncated_body(self) -> Case:
        path = self._path()
        request = http_request(path, self._body(path), [self.auth])
        cut = self.rng.randrange(len(request) - len(self._body(path)) + 1, len(request))
        return Case("truncated, then closed", [request[:cut]], cut_after_s=0.0)

    def lying_length(self) -> Case:
        path = self._path()
        body = self._body(path)
        request = http_request(
            path, body, [self.auth], length=len(body) + self.rng.randrange(1, 500)
        )
        return Case("Content-Length past the body", [request], statuses=frozenset({408}))

    def short_length(self) -> Case:
        path = self._path()
        body = self._body(path)
        request = http_request(path, body, [self.auth], length=self.rng.randrange(0, len(body)))
        return Case("Content-Length short of the body", [request])

    def cut_off(self) -> Case:
        """The client leaves at a stage: mid-head, after the head, mid-body, after the body,
        or once the answer has begun (a stream)."""
        r = self.rng
        path = self._path()
        request = http_request(path, self._body(path, stream=True), [self.auth])
        head_end = request.index(b"\r\n\r\n") + 4
        stage = r.choice(["mid-head", "after head", "mid-body", "after body", "mid-answer"])
        cut = {"mid-head": r.randrange(1, head_end), "after head": head_end,
               "mid-body": r.randrange(head_end, len(request)),
               "after body": len(request), "mid-answer": len(request)}[stage]  # fmt: skip
        wait = r.choice([0.0, 0.01, 0.05, 0.2]) if stage in ("after body", "mid-answer") else 0.0
        return Case("client leaves " + stage, [request[:cut]], cut_after_s=wait)

    def slow_but_whole(self) -> Case:
        """A head sent in pieces, each well within the header timeout in all."""
        path = self._path()
        request = http_request(path, self._body(path), [self.auth])
        pieces = [request[i : i + 40] for i in range(0, len(request), 40)]
        return Case("slow but whole", pieces, pause_s=0.02, statuses=frozenset({200, 429}))

    def bad_framing(self) -> Case:
        r = self.rng
        path = self._path()
        body = self._body(path)
        variant = r.choice([
            http_request(path, body, [self.auth, b"Content-Length: 3"]),  # two lengths
            http_request(path, body, [self.auth, b"Transfer-Encoding: chunked"]),  # both
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: g\r\nTransfer-Encoding: chunked\r\n"
            + self.auth + b"\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n",  # a bad chunk size
            b"POST " + path.encode() + b" HTTP/9.9\r\nHost: g\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),  # TLS to a plain port
            b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: g\r\n\r\n",  # a long request line
        ])  # fmt: skip
        return Case("bad framing", [variant])


async def run(url: str, cases: Cases, seconds: float, concurrency: int = 8) -> Outcome:
    """Cases for `seconds`, `concurrency` at a time; what came back, and what was wrong."""
    outcome = Outcome()
    deadline = time.monotonic() + seconds

    async def sender() -> None:
        while time.monotonic() < deadline:
            case = cases.next()
            outcome.cases[case.kind] += 1
            answer = await _send(url, case)
            outcome.statuses[answer.status if answer else None] += 1
            problem = _judge(case, answer)
            if problem:
                outcome.wrong.append(f"{problem} <- {case.describe()}")

    await asyncio.gather(*(sender() for _ in range(concurrency)))
    return outcome


async def _send(url: str, case: Case) -> Raw | None:
    if case.cut_after_s is None:
        return await raw(url, *case.parts, pause_s=case.pause_s, within_s=15)
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        for part in case.parts:
            writer.write(part)
        await writer.drain()
        await asyncio.sleep(case.cut_after_s)
        if case.kind.endswith("mid-answer"):
            await reader.read(64)  # the head, or the first event
    finally:
        writer.transport.abort()  # a reset, as a client that dies
    return None


def _judge(case: Case, answer: Raw | None) -> str | None:
    if answer is None:  # the client left
        return None
    if answer.status is None:
        return None  # closed without an answer: a head past what is parsed, or a timeout
    if answer.status >= 500:
        return f"answered {answer.status}"
    if case.statuses is not None and answer.status not in case.statuses:
        return f"answered {answer.status}, not one of {sorted(case.statuses)}"
    if answer.status == 200:
        return None
    try:
        error = orjson.loads(answer.body)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"answered {answer.status} with a body that is not an OpenAI error"
    if not isinstance(error, dict) or not error.get("code"):
        return f"answered {answer.status} without an error code"
    return None
