"""Parts of the OpenAI surface that are easy to get wrong: a forced tool call is made (or
never passed off as made), and a completions batch is served as SGLang serves it."""

from __future__ import annotations

import json
from typing import Any

import httpx

from agents.config import ModelConfig
from tests.kits.inproc import KEY, MODEL, local_gateway, region_config
from tests.kits.sim import running_sim, sse

AUTH = {"Authorization": f"Bearer {KEY}"}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"], "additionalProperties": False}}}  # fmt: skip
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}


def _config(url: str) -> Any:
    tools = {MODEL: ModelConfig(MODEL, 4096, frozenset({"chat", "completion", "tools"}))}
    return region_config("r", [url], models=tools)


def _chat(choice: Any, stream: bool = False, marked: bool = False) -> dict[str, Any]:
    content = "the weather in Oslo?" + (" FAIL:tool" if marked else "")
    return {"model": MODEL, "max_tokens": 16, "tools": [WEATHER, CLOCK], "tool_choice": choice,
            "stream": stream, "messages": [{"role": "user", "content": content}]}  # fmt: skip


async def test_a_forced_tool_call_is_made_or_never_passed_off_as_made() -> None:
    async with (
        running_sim("--fail-marker", "FAIL", model=MODEL) as sim,
        local_gateway(_config(sim.url)) as region,
        httpx.AsyncClient(base_url=region.url, headers=AUTH, timeout=30) as http,
    ):
        named = {"type": "function", "function": {"name": "clock"}}
        answers = {name: await http.post("/v1/chat/completions", json=_chat(choice))
                   for name, choice in (("required", "required"), ("named", named))}  # fmt: skip
        streamed = await http.post("/v1/chat/completions", json=_chat("required", stream=True))
        # an engine that calls a tool it was not offered, where the request named one
        broken = await http.post("/v1/chat/completions", json=_chat(named, marked=True))
        plain = await http.post("/v1/chat/completions", json=_chat("auto", marked=True))
    for name, expected in (("required", "weather"), ("named", "clock")):
        answer = answers[name]
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == expected
        arguments = json.loads(call["function"]["arguments"])
        if expected == "weather":  # what its schema requires, of the types it says
            assert isinstance(arguments["city"], str)
            assert isinstance(arguments["days"], int)
    events = await sse(streamed)
    calls = [c for e in events if isinstance(e, dict) and e.get("choices")
             for c in e["choices"][0]["delta"].get("tool_calls") or []]  # fmt: skip
    assert [c["function"]["name"] for c in calls] == ["weather"]
    assert broken.status_code == 502
    assert broken.json()["code"] == "tool_choice_unmet"
    assert "clock" in broken.json()["detail"]
    assert plain.status_code == 200  # "auto" forces nothing: the answer is the engine's


async def test_a_completions_batch_is_a_choice_per_prompt() -> None:
    async with (
        running_sim(model=MODEL) as sim,
        local_gateway(region_config("r", [sim.url])) as region,
        httpx.AsyncClient(base_url=region.url, headers=AUTH, timeout=30) as http,
    ):
        prompts = ["the river", "the old man", "a city by the sea"]
        body = {"model": MODEL, "prompt": prompts, "max_tokens": 5}
        whole = await http.post("/v1/completions", json=body)
        usage = {"stream": True, "stream_options": {"include_usage": True}}
        streamed = await http.post("/v1/completions", json={**body, **usage})
        too_many = await http.post("/v1/completions", json={**body, "prompt": ["x"] * 65})
    assert whole.status_code == 200, whole.text
    doc = whole.json()
    assert [c["index"] for c in doc["choices"]] == [0, 1, 2]
    assert all(c["text"] for c in doc["choices"])
    assert doc["usage"]["completion_tokens"] == 15
    events = [e for e in await sse(streamed) if isinstance(e, dict)]
    assert {e["choices"][0]["index"] for e in events if e["choices"]} == {0, 1, 2}
    assert events[-1]["usage"]["completion_tokens"] == 15
    assert too_many.status_code == 400
    assert too_many.json()["error"]["param"] == "prompt"
