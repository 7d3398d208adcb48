"""A request whose `tool_choice` forces a call (`required`, or a function named) is answered
with that call, or not at all: a whole answer without it is never passed off as meeting the
request. (A stream's answer went out as it came; the quality guard judges it.)"""

from __future__ import annotations

from aiohttp import web

from agents.gateway import answers
from agents.gateway.errors import ToolChoiceUnmet
from agents.gateway.requests import Inference
from agents.quality.detectors import unmet_tool_choice


def forced_call_made(inference: Inference, response: web.StreamResponse) -> None:
    """Raise ToolChoiceUnmet for a whole answer that did not make the forced call, unless its
    length cap cut it (the client's choice)."""
    if not isinstance(response, web.Response) or response.status != 200:
        return
    answer = answers.from_body(response.body, inference)  # type: ignore[arg-type]
    if answer is not None and answer.finish_reason != "length" and unmet_tool_choice(answer):
        forced = inference.tool_forced
        wanted = "a tool call" if forced == "*" else f"a call of {forced}"
        raise ToolChoiceUnmet(f"tool_choice asked for {wanted}; the model answered without it")
