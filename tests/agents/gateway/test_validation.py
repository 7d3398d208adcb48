"""What a request may ask, checked as OpenAI checks it, before any engine sees it: the prompt
and the answer fit the model's context, every parameter has its type and range, and one
choice is asked for. A request that broke two workers is not tried on a third, nor
escalated; a worker that merely answers 500 is a worker's failure, and is retried around.

The engines are real simulators whose poison fault kills one that sees a marked request, so
"no engine saw it" is seen: they are all still alive."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from agents.gateway import assertion
from tests.kits.inproc import KEY, MODEL, TENANT, escalating_pair, local_gateway
from tests.kits.inproc import region_config as config_of
from tests.kits.sim import Sim, running_sim

AUTH = {"Authorization": f"Bearer {KEY}"}
POISON = "kills-the-engine"
CONTEXT = 4096  # the in-process region's model


def _chat(**changes: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"hi {POISON}"}],
            "max_tokens": 4} | changes  # fmt: skip


async def _poison(sim: Sim, text: str | None = POISON) -> None:
    async with sim.client() as http:
        assert (await http.post("/sim/faults", json={"poison": text})).status_code == 200


async def _up(sim: Sim) -> bool:
    try:
        async with sim.client(timeout=2) as http:
            return (await http.get("/health")).status_code == 200
    except httpx.TransportError:
        return False


BAD = {
    "max_tokens past the context": (_chat(max_tokens=10**12), "max_tokens",
                                    "context_length_exceeded"),
    "max_completion_tokens past it": (_chat(max_completion_tokens=CONTEXT), "max_tokens",
                                      "context_length_exceeded"),
    "a prompt past it": (_chat(messages=[{"role": "user", "content": POISON * 5_000}]),
                         "messages", "context_length_exceeded"),
    "temperature as text": (_chat(temperature="hot"), "temperature", "invalid_request"),
    "temperature past 2": (_chat(temperature=2.5), "temperature", "invalid_request"),
    "top_p past 1": (_chat(top_p=1.5), "top_p", "invalid_request"),
    "n of 3": (_chat(n=3), "n", "invalid_request"),
    "n of 0": (_chat(n=0), "n", "invalid_request"),
    "logprobs as a number": (_chat(logprobs=1), "logprobs", "invalid_request"),
    "top_logprobs without logprobs": (_chat(top_logprobs=3), "top_logprobs", "invalid_request"),
    "top_logprobs past 20": (_chat(logprobs=True, top_logprobs=21), "top_logprobs",
                             "invalid_request"),
    "a tool that is not a function": (_chat(tools=[{"type": "web"}]), "tools.0.type",
                                      "invalid_request"),
    "a tool with a bad name": (_chat(tools=[{"type": "function", "function": {"name": "a b"}}]),
                               "tools.0.function.name", "invalid_request"),
    "an unknown role": (_chat(messages=[{"role": "wizard", "content": "hi"}]), "messages",
                        "invalid_request"),
    "max_tokens true": (_chat(max_tokens=True), "max_tokens", "invalid_request"),
    "stop of five": (_chat(stop=["a", "b", "c", "d", "e"]), "stop", "invalid_request"),
    "penalty past 2": (_chat(presence_penalty=3), "presence_penalty", "invalid_request"),
}  # fmt: skip


async def test_bad_parameters_get_400_naming_them_and_no_engine_sees_them() -> None:
    async with running_sim(model=MODEL) as sim, local_gateway(config_of("r", [sim.url])) as r:
        await _poison(sim)
        answers = {}
        async with httpx.AsyncClient(base_url=r.url, headers=AUTH, timeout=10) as http:
            for name, (body, _, _) in BAD.items():
                answers[name] = await http.post("/v1/chat/completions", json=body)
            completions = await http.post("/v1/completions", json={
                "model": MODEL, "prompt": POISON, "logprobs": 6})  # fmt: skip
            native = await http.post("/generate", json={
                "model": MODEL, "text": POISON, "sampling_params": {"top_p": 0}})  # fmt: skip
            await _poison(sim, None)
            fine = await http.post("/v1/chat/completions", json=_chat(
                temperature=0, top_p=1, n=1, logprobs=True, top_logprobs=2, stop="x",
                max_tokens=16))  # fmt: skip
    got = {name: (a.status_code, a.json()["error"]["param"], a.json()["error"]["code"])
           for name, a in answers.items()}  # fmt: skip
    assert got == {name: (400, param, code) for name, (_, param, code) in BAD.items()}
    # the message says what is wrong with the value, not with a type it is not
    assert "up to 4 stop sequences" in answers["stop of five"].json()["error"]["message"]
    assert "valid string" not in answers["stop of five"].json()["error"]["message"]
    assert (completions.status_code, completions.json()["error"]["param"]) == (400, "logprobs")
    assert native.status_code == 400
    assert native.json()["error"]["param"] == "sampling_params.top_p"
    assert fine.status_code == 200  # and the engine lived through all of it


async def test_a_request_that_broke_two_workers_is_not_tried_on_a_third() -> None:
    async with (
        running_sim(model=MODEL) as one,
        running_sim(model=MODEL) as two,
        running_sim(model=MODEL) as three,
        escalating_pair([one.url, two.url, three.url], []) as (a, b),
    ):
        for sim in (one, two, three):
            await _poison(sim)
        async with httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=10) as http:
            poisoned = await http.post("/v1/chat/completions", json=_chat())
            alive = [s for s in (one, two, three) if await _up(s)]
            await _poison(alive[0], None)
            fine = await http.post(
                "/v1/chat/completions",
                json=_chat(messages=[{"role": "user", "content": "hello"}]),
            )
    assert poisoned.status_code == 502
    assert poisoned.json()["error"]["code"] == "upstream_failed"
    assert "not tried again" in poisoned.json()["error"]["message"]
    assert len(alive) == 1  # two engines died of it; the third never saw it
    assert b.gateway.escalations.books.escalations == {}  # nor did the peer region
    assert fine.status_code == 200


async def test_workers_that_answer_500_are_retried_around_and_escalated() -> None:
    async with (
        running_sim(model=MODEL) as one,
        running_sim(model=MODEL) as two,
        running_sim(model=MODEL) as peer,
        escalating_pair([one.url, two.url], [peer.url]) as (a, _),
    ):
        for sim in (one, two):
            async with sim.client() as http:
                await http.post("/sim/faults", json={"error_rate": 1.0})
        async with httpx.AsyncClient(base_url=a.url, headers=AUTH, timeout=10) as http:
            first = await http.post("/v1/chat/completions", json=_chat())
    assert first.status_code == 200
    assert first.headers["x-meridian-region"] == "b"


async def test_a_replayed_escalation_assertion_gets_401() -> None:
    async with running_sim(model=MODEL) as sim, escalating_pair([], [sim.url]) as (a, b):
        assert a.config.signer is not None
        body = orjson.dumps(_chat(messages=[{"role": "user", "content": "hi"}]))
        signed = assertion.sign(
            a.config.signer, origin="a", audience="b", tenant=TENANT, request_id="rid-1",
            reason="overload", body=body, debug=False,
        )  # fmt: skip
        headers = {assertion.HEADER: signed, "X-Request-ID": "rid-1",
                   "Content-Type": "application/json"}  # fmt: skip
        async with httpx.AsyncClient(base_url=b.url, timeout=10) as http:
            first = await http.post("/v1/chat/completions", content=body, headers=headers)
            replayed = await http.post("/v1/chat/completions", content=body, headers=headers)
    assert first.status_code == 200
    assert replayed.status_code == 401
    assert replayed.json()["error"]["code"] == "invalid_api_key"
