"""A batch's input file, read and checked whole before anything is stored: JSONL, one request
a line, as OpenAI's Batch API takes it:

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

Each `custom_id` is unique in the file; `url` is one endpoint the gateways serve; `body` an
object naming its `model`, not streamed. A file that breaks a rule is refused with the line
(from 1) and what is wrong with it, and nothing is kept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_BYTES = 100 * 1024 * 1024
MAX_LINES = 50_000
MAX_CUSTOM_ID = 512
MAX_PROBLEMS = 20  # of a file's problems, told at most


@dataclass(frozen=True, slots=True)
class Line:
    custom_id: str
    url: str
    model: str
    body: bytes  # the request's body, as the file gave it (re-encoded from its JSON once)


@dataclass(frozen=True, slots=True)
class Problem:
    line: int  # from 1, as an editor counts
    message: str

    def doc(self) -> dict[str, Any]:
        return {"code": "invalid_request", "line": self.line, "message": self.message}


def read_lines(data: bytes) -> tuple[list[Line], list[Problem]]:
    """The file's requests, or its problems (at most MAX_PROBLEMS)."""
    lines: list[Line] = []
    problems: list[Problem] = []
    seen: set[str] = set()
    if len(data) > MAX_BYTES:
        return [], [Problem(0, f"the file is over {MAX_BYTES} bytes")]
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        if len(lines) + len(problems) >= MAX_LINES:
            problems.append(Problem(number, f"a batch takes at most {MAX_LINES} requests"))
            break
        line, problem = _line(number, raw, seen)
        if problem is not None:
            problems.append(problem)
            if len(problems) >= MAX_PROBLEMS:
                break
        elif line is not None:
            lines.append(line)
    if not lines and not problems:
        problems.append(Problem(0, "the file holds no request"))
    return lines, problems


def _line(number: int, raw: bytes, seen: set[str]) -> tuple[Line | None, Problem | None]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return None, Problem(number, f"not JSON: {error}")
    if not isinstance(doc, dict):
        return None, Problem(number, "each line must be a JSON object")
    custom_id, method, url, body = (doc.get(k) for k in ("custom_id", "method", "url", "body"))
    unknown = set(doc) - {"custom_id", "method", "url", "body"}
    if unknown:
        return None, Problem(number, f"unknown fields: {', '.join(sorted(unknown))}")
    if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
        return None, Problem(number, f"custom_id must be a string of 1 to {MAX_CUSTOM_ID} "
                                     "characters")  # fmt: skip
    if custom_id in seen:
        return None, Problem(number, f"custom_id {custom_id!r} is used twice")
    seen.add(custom_id)
    if method != "POST":
        return None, Problem(number, "method must be POST")
    if url not in ENDPOINTS:
        return None, Problem(number, f"url must be one of {', '.join(ENDPOINTS)}")
    model = body.get("model") if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(model, str) or not 1 <= len(model) <= 255:
        return None, Problem(number, "body must be an object that names its model")
    if body.get("stream"):
        return None, Problem(number, "a batch's requests are not streamed")
    return Line(custom_id, url, model, orjson.dumps(body)), None
